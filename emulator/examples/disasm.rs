//! Print the disassembly of a code object: `cargo run -p emulator --example disasm FILE.elf`.
fn main() {
    let path = std::env::args().nth(1).expect("usage: disasm FILE.elf");
    let data = std::fs::read(&path).expect("read code object");
    match emulator::disassemble(&data) {
        Ok(t) => print!("{t}"),
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    }
}
