//! Code-object loader: validates an ELF64 `EM_AMDGPU` gfx11 shared object, builds its memory
//! image (every PT_LOAD segment at its virtual address), and reads kernel descriptors and the
//! `NT_AMDGPU_METADATA` note. Nothing here panics on malformed input: every failure is a named
//! [`EmuError`].
use crate::error::EmuError;
use object::LittleEndian as LE;
use object::elf::{EM_AMDGPU, FileHeader64, PT_LOAD, SHT_DYNSYM, SHT_SYMTAB};
use object::read::elf::{FileHeader, ProgramHeader};

/// `e_flags` EF_AMDGPU_MACH values of gfx11 parts (AMDGPUUsage "AMDGPU ELF Header").
const GFX11_MACHS: &[(u32, &str)] = &[
    (0x41, "gfx1100"),
    (0x43, "gfx1150"),
    (0x44, "gfx1103"),
    (0x46, "gfx1101"),
    (0x47, "gfx1102"),
    (0x4a, "gfx1151"),
    (0x54, "gfx11-generic"),
    (0x55, "gfx1152"),
    (0x58, "gfx1153"),
];
const EF_AMDGPU_MACH: u32 = 0xff;
const NT_AMDGPU_METADATA: u32 = 32;

/// Fields of the 64-byte kernel descriptor the device needs (AMDGPUUsage "Kernel Descriptor").
#[derive(Clone, Debug, Default)]
pub struct KernelDescriptor {
    pub group_segment_size: u32,
    pub private_segment_size: u32,
    pub kernarg_size: u32,
    /// Virtual address of the first instruction (descriptor address + entry byte offset).
    pub entry: u64,
    pub rsrc1: u32,
    pub rsrc2: u32,
    pub rsrc3: u32,
    pub properties: u16,
}
impl KernelDescriptor {
    pub fn user_sgpr_count(&self) -> u32 {
        (self.rsrc2 >> 1) & 0x1f
    }
    pub fn wave32(&self) -> bool {
        self.properties & (1 << 10) != 0
    }
    pub fn enable_dispatch_ptr(&self) -> bool {
        self.properties & (1 << 1) != 0
    }
    pub fn enable_queue_ptr(&self) -> bool {
        self.properties & (1 << 2) != 0
    }
    pub fn enable_kernarg_ptr(&self) -> bool {
        self.properties & (1 << 3) != 0
    }
    pub fn enable_dispatch_id(&self) -> bool {
        self.properties & (1 << 4) != 0
    }
    pub fn enable_private_segment_size(&self) -> bool {
        self.properties & (1 << 6) != 0
    }
    pub fn enable_wg_id(&self, dim: usize) -> bool {
        self.rsrc2 & (1 << (7 + dim)) != 0
    }
    pub fn enable_wg_info(&self) -> bool {
        self.rsrc2 & (1 << 10) != 0
    }
    pub fn enable_private_segment(&self) -> bool {
        self.rsrc2 & 1 != 0
    }
    /// 0: only X, 1: X,Y, 2: X,Y,Z (packed into v0 on gfx11)
    pub fn workitem_id_vgprs(&self) -> u32 {
        (self.rsrc2 >> 11) & 3
    }
    /// FLOAT_DENORM_MODE_32: 3 = keep denormals, 0 = flush in and out.
    pub fn f32_denorm_mode(&self) -> u32 {
        (self.rsrc1 >> 16) & 3
    }
    pub fn f16_denorm_mode(&self) -> u32 {
        (self.rsrc1 >> 18) & 3
    }
    pub fn dx10_clamp(&self) -> bool {
        self.rsrc1 & (1 << 21) != 0
    }
    pub fn ieee(&self) -> bool {
        self.rsrc1 & (1 << 23) != 0
    }
}

/// One kernel argument from the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernArg {
    pub offset: u32,
    pub size: u32,
    pub value_kind: String,
}

/// Per-kernel metadata (the `amdhsa.kernels[]` entry).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    pub symbol: String,
    pub kernarg_size: u32,
    pub args: Vec<KernArg>,
    pub group_segment_size: u32,
    pub private_segment_size: u32,
    pub wavefront_size: u32,
    pub max_flat_workgroup_size: u32,
    pub vgpr_count: u32,
    pub sgpr_count: u32,
}

/// A validated code object, ready to be placed in device memory.
pub struct CodeObject {
    pub arch: &'static str,
    /// Memory image from address 0 to the end of the last PT_LOAD segment.
    pub image: Vec<u8>,
    /// Executable ranges [start, end) (virtual addresses) of PF_X segments.
    pub text: Vec<(u64, u64)>,
    pub kernels: Vec<(KernelInfo, KernelDescriptor)>,
    /// Function symbols (name, address): extra decode roots and disassembly labels.
    pub functions: Vec<(String, u64)>,
    /// The symbol sizes of `functions` (0 when the symbol does not say).
    pub function_sizes: Vec<u64>,
}

/// How far the loaded image may extend beyond the file's own size.
const MAX_IMAGE_SLACK: u64 = 4 << 20;

fn bad(what: impl Into<String>) -> EmuError {
    EmuError::BadElf(what.into())
}

/// Parse and validate a code object.
pub fn load(data: &[u8]) -> Result<CodeObject, EmuError> {
    let hdr = FileHeader64::<LE>::parse(data).map_err(|e| bad(format!("ELF header: {e}")))?;
    let e = hdr.endian().map_err(|e| bad(format!("ELF endianness: {e}")))?;
    let machine = hdr.e_machine(e);
    let mach = hdr.e_flags(e) & EF_AMDGPU_MACH;
    if machine != EM_AMDGPU {
        return Err(EmuError::NotGfx11 { machine, mach });
    }
    let arch =
        GFX11_MACHS.iter().find(|(m, _)| *m == mach).map(|(_, n)| *n).ok_or(EmuError::NotGfx11 { machine, mach })?;

    let phdrs = hdr.program_headers(e, data).map_err(|err| bad(format!("program headers: {err}")))?;
    let mut end = 0u64;
    for ph in phdrs.iter().filter(|p| p.p_type(e) == PT_LOAD) {
        let top = ph.p_vaddr(e).checked_add(ph.p_memsz(e)).ok_or_else(|| bad("PT_LOAD segment wraps"))?;
        // Code comes from the file: a zero-filled executable tail would only be v_illegal
        // words, and the decoder keeps one entry per word of text.
        if ph.p_flags(e) & object::elf::PF_X != 0 && ph.p_filesz(e) < ph.p_memsz(e) {
            return Err(bad(format!(
                "executable PT_LOAD at {:#x} is {:#x} bytes in memory but {:#x} in the file (zero-filled code)",
                ph.p_vaddr(e),
                ph.p_memsz(e),
                ph.p_filesz(e)
            )));
        }
        end = end.max(top);
    }
    // Address gaps and zero-filled data beyond the file stay small in real code objects
    // (page alignment, .bss of a few KiB); a fuzzed header can claim 256 MiB for a 1 KiB file,
    // and the image, its device copy and the disassembler's copy would all be that large.
    let limit = data.len() as u64 + MAX_IMAGE_SLACK;
    if end == 0 {
        // (not "implausible size": nothing is too large, there is nothing to load)
        return Err(bad(format!(
            "the code object has an empty load image: no PT_LOAD segment ends above address 0 (program headers at offset {:#x})",
            hdr.e_phoff(e)
        )));
    }
    if end > limit {
        return Err(bad(format!(
            "implausible image size {end:#x}: PT_LOAD segments end there, but a {:#x}-byte file allows at most {limit:#x}",
            data.len()
        )));
    }
    let mut image = vec![0u8; end as usize];
    let mut text = Vec::new();
    let mut meta_desc: Option<Vec<u8>> = None;
    for ph in phdrs.iter() {
        if ph.p_type(e) == PT_LOAD {
            let bytes =
                ph.data(e, data).map_err(|_| bad(format!("PT_LOAD at offset {:#x} outside file", ph.p_offset(e))))?;
            if bytes.len() as u64 > ph.p_memsz(e) {
                return Err(bad("PT_LOAD filesz > memsz"));
            }
            let va = ph.p_vaddr(e) as usize;
            image[va..va + bytes.len()].copy_from_slice(bytes);
            if ph.p_flags(e) & object::elf::PF_X != 0 {
                text.push((ph.p_vaddr(e), ph.p_vaddr(e) + ph.p_memsz(e)));
            }
        }
        if let Ok(Some(mut notes)) = ph.notes(e, data) {
            while let Ok(Some(note)) = notes.next() {
                if note.name() == b"AMDGPU" && note.n_type(e) == NT_AMDGPU_METADATA {
                    meta_desc = Some(note.desc().to_vec());
                }
            }
        }
    }
    let meta = meta_desc.ok_or_else(|| EmuError::Metadata("no NT_AMDGPU_METADATA note".into()))?;
    let infos = crate::loader::parse_metadata(&meta)?;

    // Symbols: `.kd` descriptors and function entry points.
    let sections = hdr.sections(e, data).map_err(|err| bad(format!("section headers: {err}")))?;
    let mut syms: Vec<(String, u64, u64, u8)> = Vec::new();
    for kind in [SHT_SYMTAB, SHT_DYNSYM] {
        let table = sections.symbols(e, data, kind).map_err(|err| bad(format!("symbol table: {err}")))?;
        for s in table.iter() {
            use object::read::elf::Sym;
            let name = s.name(e, table.strings()).map_err(|err| bad(format!("symbol name: {err}")))?;
            let name = String::from_utf8_lossy(name).into_owned();
            if !name.is_empty() && !syms.iter().any(|x| x.0 == name) {
                syms.push((name, s.st_value(e), s.st_size(e), s.st_type()));
            }
        }
    }
    let func_syms: Vec<_> =
        syms.iter().filter(|s| s.3 == object::elf::STT_FUNC && text.iter().any(|t| s.1 >= t.0 && s.1 < t.1)).collect();
    let functions: Vec<(String, u64)> = func_syms.iter().map(|s| (s.0.clone(), s.1)).collect();
    let function_sizes: Vec<u64> = func_syms.iter().map(|s| s.2).collect();
    let mut kernels = Vec::new();
    for info in infos {
        let sym = if info.symbol.is_empty() { format!("{}.kd", info.name) } else { info.symbol.clone() };
        let derr = |what: String| EmuError::Descriptor { kernel: info.name.clone(), what };
        let (_, addr, _, _) =
            syms.iter().find(|s| s.0 == sym).ok_or_else(|| derr(format!("symbol {sym} not found")))?;
        let kd = usize::try_from(*addr)
            .ok()
            .and_then(|a| image.get(a..a.checked_add(64)?))
            .ok_or_else(|| derr(format!("descriptor at {addr:#x} outside the image")))?;
        let u32at = |o: usize| u32::from_le_bytes(kd[o..o + 4].try_into().unwrap());
        let entry_off = i64::from_le_bytes(kd[16..24].try_into().unwrap());
        let entry = (*addr as i64).wrapping_add(entry_off) as u64;
        let d = KernelDescriptor {
            group_segment_size: u32at(0),
            private_segment_size: u32at(4),
            kernarg_size: u32at(8),
            entry,
            rsrc3: u32at(44),
            rsrc1: u32at(48),
            rsrc2: u32at(52),
            properties: u16::from_le_bytes([kd[56], kd[57]]),
        };
        if !text.iter().any(|t| entry >= t.0 && entry < t.1) {
            return Err(derr(format!("entry {entry:#x} is not in an executable segment")));
        }
        if !d.wave32() {
            return Err(derr("wave64 kernels are not supported (the device runs wave32)".into()));
        }
        kernels.push((info, d));
    }
    Ok(CodeObject { arch, image, text, kernels, functions, function_sizes })
}

/// Parse the msgpack `amdhsa.kernels` list.
pub fn parse_metadata(bytes: &[u8]) -> Result<Vec<KernelInfo>, EmuError> {
    use rmpv::Value;
    let merr = |s: String| EmuError::Metadata(s);
    let v = rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| merr(format!("msgpack: {e}")))?;
    fn get<'a>(m: &'a Value, key: &str) -> Option<&'a Value> {
        m.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }
    fn num(m: &Value, key: &str) -> u32 {
        get(m, key).and_then(|v| v.as_u64()).unwrap_or(0) as u32
    }
    let ks =
        get(&v, "amdhsa.kernels").and_then(|k| k.as_array()).ok_or_else(|| merr("no amdhsa.kernels list".into()))?;
    let mut out = Vec::new();
    for (i, k) in ks.iter().enumerate() {
        let name = get(k, ".name")
            .and_then(|n| n.as_str())
            .ok_or_else(|| merr(format!("kernel #{i} has no .name")))?
            .to_string();
        let mut args = Vec::new();
        if let Some(list) = get(k, ".args").and_then(|a| a.as_array()) {
            for (j, a) in list.iter().enumerate() {
                let value_kind = get(a, ".value_kind")
                    .and_then(|s| s.as_str())
                    .ok_or_else(|| merr(format!("{name}: arg #{j} has no .value_kind")))?
                    .to_string();
                args.push(KernArg { offset: num(a, ".offset"), size: num(a, ".size"), value_kind });
            }
        }
        out.push(KernelInfo {
            symbol: get(k, ".symbol").and_then(|s| s.as_str()).unwrap_or("").to_string(),
            kernarg_size: num(k, ".kernarg_segment_size"),
            group_segment_size: num(k, ".group_segment_fixed_size"),
            private_segment_size: num(k, ".private_segment_fixed_size"),
            wavefront_size: num(k, ".wavefront_size"),
            max_flat_workgroup_size: num(k, ".max_flat_workgroup_size"),
            vgpr_count: num(k, ".vgpr_count"),
            sgpr_count: num(k, ".sgpr_count"),
            name,
            args,
        });
    }
    Ok(out)
}
