//! Rough throughput of the device on a memory-bound kernel (the `vadd` Rust fixture):
//! `cargo run -p emulator --release --example throughput -- FIXTURE.elf` (the test suite builds
//! the fixture into target/tmp/rust-kernels-fixture/target/amdgcn-amd-amdhsa/release/lds_stable.elf).
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: throughput FIXTURE.elf  (see the module doc for where the tests build it)");
        std::process::exit(2);
    };
    let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let elf = &elf[..];
    let dev = emulator::Device::new();
    let m = dev.load_module(elf).expect("load");
    let f = m.function("vadd").expect("vadd");
    let n = 1usize << 20;
    let (a, b, o) = (dev.malloc(n * 4).unwrap(), dev.malloc(n * 4).unwrap(), dev.malloc(n * 4).unwrap());
    let mut ka = Vec::new();
    for p in [a, b, o] {
        ka.extend_from_slice(&p.to_le_bytes());
    }
    ka.extend_from_slice(&(n as u32).to_le_bytes());
    let t = std::time::Instant::now();
    let st = dev.launch(&f, [(n / 64) as u32, 1, 1], [64, 1, 1], 0, &ka).expect("launch");
    let dt = t.elapsed().as_secs_f64();
    println!(
        "vadd n={n}: {:.3} s, {:.1} M instructions/s (wave), {:.1} MB/s global, {:.1} M lane-ops/s",
        dt,
        st.instructions as f64 / dt / 1e6,
        (st.global_bytes_read + st.global_bytes_written) as f64 / dt / 1e6,
        st.lane_ops as f64 / dt / 1e6
    );
    println!("VALU loop: {:.1} M lane-ops/s on one core", emulator::bench_lane_ops_per_sec() / 1e6);
}
