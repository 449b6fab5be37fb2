//! Test-only: which opcodes of the tables the executor implements (`cargo test -p emulator
//! --lib coverage -- --nocapture` prints the missing ones).
use crate::decode::{Inst, decode};
use crate::exec::{self, Counters, Ctx, Program, Wave};
use crate::memory::{Memory, View};
use crate::optable;

fn try_exec(words: &[u32]) -> Option<Result<(), String>> {
    let i: Inst = decode(words).ok()?;
    let mut insts = vec![Inst::INVALID; 8];
    insts[0] = i;
    // s_endpgm after it
    insts[i.len as usize / 4] = decode(&[0xBFB00000]).ok()?;
    let prog = Program { base: 0x1000, insts, kernel_names: Vec::new(), words: Vec::new() };
    let mem = Memory::default();
    let ctx = Ctx {
        prog: &prog,
        kernel: "cov",
        regions: &[],
        mem: &mem,
        budget: 100,
        f32_denorm: true,
        f16_denorm: true,
        ieee: true,
        private_size: 64,
    };
    let mut w = Wave::new(&ctx);
    w.pc = 0x1000;
    w.s[126] = u32::MAX;
    let mut lds = vec![0u8; 65536];
    let mut view = View::new(&[]);
    let mut c = Counters::default();
    Some(match exec::run(&ctx, &mut w, &mut lds, &mut view, &mut c) {
        Err(crate::EmuError::Unsupported { what, .. }) => Err(what),
        _ => Ok(()),
    })
}

#[test]
fn coverage_report() {
    let mut missing = Vec::new();
    let mut total = 0;
    for d in optable::VALU.iter() {
        let w = [0xD4000000 | (d.op as u32) << 16 | 10, (256 + 40) << 18 | (256 + 30) << 9 | (256 + 20)];
        if let Some(r) = try_exec(&w) {
            total += 1;
            if let Err(e) = r {
                missing.push(e);
            }
        }
    }
    for d in optable::VOP3P.iter() {
        let w =
            [0xCC000000 | (d.op as u32) << 16 | 1 << 14 | 40, 3 << 27 | (256 + 8) << 18 | (256 + 16) << 9 | (256 + 24)];
        if let Some(r) = try_exec(&w) {
            total += 1;
            if let Err(e) = r {
                missing.push(e);
            }
        }
    }
    for (tab, mk) in [
        (optable::SOP1, (|op: u32| 0xBE800000 | 10 << 16 | op << 8 | 20) as fn(u32) -> u32),
        (optable::SOP2, |op| 0x80000000 | op << 23 | 10 << 16 | 30 << 8 | 20),
        (optable::SOPC, |op| 0xBF000000 | op << 16 | 30 << 8 | 20),
        (optable::SOPK, |op| 0xB0000000 | op << 23 | 10 << 16 | 4),
    ] {
        for d in tab.iter() {
            if let Some(r) = try_exec(&[mk(d.op as u32), 0]) {
                total += 1;
                if let Err(e) = r {
                    missing.push(e);
                }
            }
        }
    }
    for d in optable::DS.iter() {
        // register fields the opcode does not use stay zero (the decoder requires it)
        let f = |sh: u8, v: u32| if sh == 0 { 0 } else { v };
        let w = [
            0xD8000000 | (d.op as u32) << 18,
            f(d.dst, 20) << 24 | f(d.src[2], 12) << 16 | f(d.src[1], 8) << 8 | f(d.src[0], 4),
        ];
        if let Some(r) = try_exec(&w) {
            total += 1;
            if let Err(e) = r {
                missing.push(e);
            }
        }
    }
    eprintln!("executor coverage: {} of {total} probed opcodes implemented; missing:", total - missing.len());
    for m in &missing {
        eprintln!("  {m}");
    }
    // guard against regressions (the missing ones are exotic or wave64-only)
    assert!(missing.len() <= 40, "{} opcodes unimplemented", missing.len());
}
