//! Launchers of the MoE kernels (gpu-kernels/src/ops/fwd.rs, mmvq.rs): the router, expert
//! dispatch (`mmvq_moe_*`, the router's choice read on the device), a prompt chunk's slots
//! sorted by expert, the expert cache's slot map, the combine and Flash-Next's shared expert.
use super::{GluAct, GpuOps, bad, groups};
use crate::abi::{self, WType};
use crate::device::{DevicePtr, Result, Stream};

/// Which activation column each slot of a [`GpuOps::mmvq_moe`] launch reads: slot `s` of
/// token `s / x_div` (`Div`; a plain `u32` converts to it), or `cols[s]` from a device list
/// (`List`: slots sorted by expert, [`GpuOps::moe_sort_slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotCols {
    Div(u32),
    List(DevicePtr),
}
impl From<u32> for SlotCols {
    fn from(x_div: u32) -> Self {
        SlotCols::Div(x_div)
    }
}

impl GpuOps {
    /// MMVQ over the experts the router chose, read from the device (`abi::MmvqMoeArgs`): for
    /// slot `s < n_slots` (token `s / k_used`, rank `s % k_used`) and row `i < nrows`,
    /// `y[s * nrows + i] = W_e[i] · x[c]` with `e = ids[s]`, `W_e = w + e * expert_bytes` and
    /// column `c = s / x_div` (`x_cols` a u32 divisor) or `cols[s]` ([`SlotCols::List`]: slots
    /// sorted by [`GpuOps::moe_sort_slots`]);
    /// with `glu = Some((w2, act))`, `act(W_e[i] · x) * (U_e[i] · x)`, `U_e = w2 + e * expert_bytes`.
    /// Bit-identical, per slot, to `mmvq` (and `mmvq_glu`) of expert `e` on that column. Slots
    /// sharing an expert are computed together, up to `max_group` columns per pass (the largest
    /// number of slots that may share one: the tokens of the window); an id `>= n_expert` traps.
    /// Nothing is read back, so the launch is graph-capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn mmvq_moe(
        &self,
        s: &Stream,
        ty: WType,
        glu: Option<(DevicePtr, GluAct)>,
        w: DevicePtr,
        expert_bytes: u64,
        n_expert: u32,
        x_q8_1: DevicePtr,
        x_cols: impl Into<SlotCols>,
        ids: DevicePtr,
        n_slots: u32,
        y: DevicePtr,
        nrows: u32,
        k: u32,
        max_group: u32,
    ) -> Result<()> {
        let name = if glu.is_some() { "mmvq_moe_glu" } else { "mmvq_moe" };
        if n_slots == 0 || n_slots > abi::MOE_MAX_SLOTS {
            return Err(bad(name, format!("{n_slots} slots (1..={})", abi::MOE_MAX_SLOTS)));
        }
        let (x_div, cols) = match x_cols.into() {
            SlotCols::Div(d) => (d, 0),
            SlotCols::List(0) => return Err(bad(name, "a column list at address 0")),
            SlotCols::List(p) => (1, p),
        };
        if x_div == 0 || !n_slots.is_multiple_of(x_div) {
            return Err(bad(name, format!("x_div {x_div} does not divide {n_slots} slots")));
        }
        let bk = ty.block_k();
        if k == 0 || !k.is_multiple_of(bk) {
            return Err(bad(name, format!("k = {k} is not a positive multiple of {bk}")));
        }
        let mat = nrows as u64 * (k / bk) as u64 * ty.block_bytes() as u64;
        if nrows == 0 || n_expert == 0 || expert_bytes < mat {
            return Err(bad(
                name,
                format!("nrows {nrows}, n_expert {n_expert}, expert_bytes {expert_bytes} (a matrix is {mat})"),
            ));
        }
        // Columns per pass: 1 for decode; else the widest instantiation whose columns fit LDS.
        let room = abi::MAX_LDS_BYTES - ty.table_lds_bytes();
        if abi::mmvq_moe_lds_bytes(ty, k, 1) > room {
            return Err(bad(name, format!("k = {k}: one staged column does not fit in 64 KiB of LDS")));
        }
        let wide = abi::mmvq_moe_max_group(ty, glu.is_some());
        let g = if max_group <= 1 || abi::mmvq_moe_lds_bytes(ty, k, wide) > room { 1 } else { wide };
        let kname =
            abi::mmvq_moe_kernel(ty, glu.is_some(), g).ok_or_else(|| bad(name, format!("no kernel for {ty:?}")))?;
        // Geometry of a pass as wide as the largest possible group (fewer row groups: each
        // stages its group's columns once).
        let rows_per_wg = abi::mmvq_rows_per_wg(ty, k, nrows, g.min(max_group.max(1)));
        let (w2, act) = glu.map_or((0, 0), |(p, a)| (p, (a == GluAct::GeluTanh) as u32));
        let args = abi::MmvqMoeArgs {
            w,
            w2,
            x: x_q8_1,
            y,
            ids,
            expert_bytes,
            cols,
            n_slots,
            x_div,
            nrows,
            k,
            rows_per_wg,
            n_expert,
            act,
            _pad: 0,
        };
        // 2-D grid: x = row group, y = slot (no divisions in the kernel).
        self.launch_grid(
            s,
            kname,
            [nrows.div_ceil(rows_per_wg), n_slots, 1],
            abi::mmvq_moe_lds_bytes(ty, k, g),
            &args.to_bytes(),
        )
    }

    /// Per token: softmax over `n_expert` (<= 512) logits, top-`k` (<= 16, ties to the lower
    /// index) into `ids_out` (u32) / `w_out` (f32) in rank order, optionally renormalised by
    /// their sum clamped at 6.103515625e-5 (== model/moe.rs).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_router(
        &self,
        s: &Stream,
        logits: DevicePtr,
        ids_out: DevicePtr,
        w_out: DevicePtr,
        n_tokens: u32,
        n_expert: u32,
        k: u32,
        renorm: bool,
    ) -> Result<()> {
        let name = abi::MOE_ROUTER;
        if n_expert == 0 || n_expert > abi::MOE_MAX_EXPERTS || k == 0 || k > abi::MOE_MAX_K || k > n_expert {
            return Err(bad(
                name,
                format!(
                    "n_expert {n_expert} (1..={}), k {k} (1..={}, <= n_expert)",
                    abi::MOE_MAX_EXPERTS,
                    abi::MOE_MAX_K
                ),
            ));
        }
        let g = groups(n_tokens as u64, abi::WAVES_PER_WG, name)?;
        let a = abi::MoeRouterArgs { logits, ids: ids_out, w: w_out, n_tokens, n_expert, k, renorm: renorm as u32 };
        self.launch(s, name, g, 0, &a.to_bytes())
    }

    /// `out[t] = sum_{j<k} w[t*k+j] * y[map[t*k+j]]` (rows of `d`), added from 0.0 in order
    /// j = 0..k. model/moe.rs adds a token's experts in increasing expert id: pass each token's
    /// `map`/`w` in that order to be bit-identical.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        s: &Stream,
        y: DevicePtr,
        map: DevicePtr,
        w: DevicePtr,
        out: DevicePtr,
        d: u32,
        n_tokens: u32,
        k: u32,
    ) -> Result<()> {
        self.moe_combine_with(s, y, map, w, out, None, d, n_tokens, k)
    }

    /// [`GpuOps::moe_combine`], then with `shared = Some((sh, gate))` Flash-Next's shared expert
    /// added in the same launch: `out[t] += σ(gate[t]) · sh[t]`, the bits of
    /// [`GpuOps::moe_shared_add`] after the combine.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_with(
        &self,
        s: &Stream,
        y: DevicePtr,
        map: DevicePtr,
        w: DevicePtr,
        out: DevicePtr,
        shared: Option<(DevicePtr, DevicePtr)>,
        d: u32,
        n_tokens: u32,
        k: u32,
    ) -> Result<()> {
        let name = abi::MOE_COMBINE;
        if k == 0 {
            return Err(bad(name, "k = 0"));
        }
        let (sh, gate) = shared.unwrap_or((0, 0));
        if shared.is_some() && (sh == 0 || gate == 0) {
            return Err(bad(name, "a shared expert's rows or gate at address 0"));
        }
        let g = groups(d.div_ceil(abi::WG_SIZE) as u64 * n_tokens as u64, 1, name)?;
        self.launch(
            s,
            name,
            g,
            0,
            &abi::MoeCombineArgs { y, map, w, out, sh, gate, d, n_tokens, k, _pad: 0 }.to_bytes(),
        )
    }

    /// A chunk's `n_slots` slots (`k` a token) ordered by expert ([`abi::MoeSortArgs`]): the
    /// sorted ids, each sorted slot's token (its activation column) and each slot's sorted row.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_sort_slots(
        &self,
        s: &Stream,
        ids: DevicePtr,
        sorted: DevicePtr,
        cols: DevicePtr,
        map: DevicePtr,
        n_slots: u32,
        k: u32,
    ) -> Result<()> {
        let name = abi::MOE_SORT_SLOTS;
        if k == 0 || n_slots == 0 || !n_slots.is_multiple_of(k) {
            return Err(bad(name, format!("{n_slots} slots of {k} a token")));
        }
        let g = groups(n_slots as u64, abi::WG_SIZE, name)?;
        self.launch(
            s,
            name,
            g,
            abi::MOE_SORT_BLOCK * 4,
            &abi::MoeSortArgs { ids, sorted, cols, map, n_slots, k, _pad: [0; 2] }.to_bytes(),
        )
    }

    /// The expert cache's view of a routing choice ([`abi::MoeSlotMapArgs`]): for each of
    /// `n_slots` slots, its cache slot from one layer's `table` (`n_expert` u32, a missing
    /// expert [`abi::MOE_SLOT_MISS`]) into `slots`, and its combine row (`j`, or `miss_base + j`
    /// for a miss) into `map`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_slot_map(
        &self,
        s: &Stream,
        ids: DevicePtr,
        table: DevicePtr,
        slots: DevicePtr,
        map: DevicePtr,
        n_slots: u32,
        n_expert: u32,
        miss_base: u32,
    ) -> Result<()> {
        let name = abi::MOE_SLOT_MAP;
        if n_expert == 0 || n_expert > abi::MOE_MAX_EXPERTS {
            return Err(bad(name, format!("n_expert {n_expert} (1..={})", abi::MOE_MAX_EXPERTS)));
        }
        let g = groups(n_slots as u64, abi::WG_SIZE, name)?;
        self.launch(
            s,
            name,
            g,
            0,
            &abi::MoeSlotMapArgs { ids, table, slots, map, n_slots, n_expert, miss_base, _pad: 0 }.to_bytes(),
        )
    }

    /// Flash-Next's sigmoid-gated shared expert: `out[t] += σ(gate[t]) · sh[t]` (rows of `d`;
    /// `gate` the shared-expert gate logits `[n_tokens]`).
    pub fn moe_shared_add(
        &self,
        s: &Stream,
        out: DevicePtr,
        sh: DevicePtr,
        gate: DevicePtr,
        d: u32,
        n_tokens: u32,
    ) -> Result<()> {
        let name = abi::MOE_SHARED_ADD;
        let g = groups(d as u64 * n_tokens as u64, abi::WG_SIZE, name)?;
        self.launch(s, name, g, 0, &abi::MoeSharedArgs { out, sh, gate, d, n_tokens }.to_bytes())
    }
}
