//! The disassembly tests' oracle: `llvm-objdump-22 -d --mcpu=gfx1100` on a code object, and
//! the line-for-line comparison with `emulator::disassemble` (instruction lines and labels, the
//! comment column included). `None` / a printed notice when llvm-objdump-22 is absent.
use std::process::Command;

pub fn lines(text: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with('\t') || l.ends_with(">:")).map(|l| l.trim_end().to_string()).collect()
}

pub fn objdump(elf: &[u8]) -> Option<Vec<String>> {
    let path = std::env::temp_dir().join(format!("emu-disasm-fam-{}-{}.elf", std::process::id(), elf.len()));
    std::fs::write(&path, elf).unwrap();
    let out = Command::new("llvm-objdump-22").args(["-d", "--mcpu=gfx1100"]).arg(&path).output();
    let _ = std::fs::remove_file(&path);
    match out {
        Ok(o) => Some(lines(&String::from_utf8_lossy(&o.stdout))),
        Err(_) => {
            eprintln!("\n*** SKIPPED: llvm-objdump-22 not found ***\n");
            None
        }
    }
}

pub fn compare(what: &str, elf: &[u8]) {
    let Some(want) = objdump(elf) else { return };
    let mine = lines(&emulator::disassemble(elf).unwrap_or_else(|e| panic!("{what}: {e}")));
    let bad: Vec<String> = want
        .iter()
        .zip(&mine)
        .filter(|(a, b)| a != b)
        .take(std::env::var("DISASM_DIFFS").ok().and_then(|v| v.parse().ok()).unwrap_or(20))
        .map(|(a, b)| format!("  objdump: {a}\n  emu:     {b}"))
        .collect();
    assert!(
        bad.is_empty() && want.len() == mine.len(),
        "{what}: {} lines vs {}; first differences:\n{}",
        want.len(),
        mine.len(),
        bad.join("\n")
    );
}
