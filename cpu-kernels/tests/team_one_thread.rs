//! With a pool of one thread (`--threads 1`), parallel regions run on the calling thread: no
//! hand-off to rayon's single worker (two thread switches per region, hundreds per token). Its
//! own test binary because it sets rayon's global pool.

#[test]
fn one_thread_regions_run_on_the_caller() {
    rayon::ThreadPoolBuilder::new().num_threads(1).build_global().expect("the global pool is set once, here");
    let caller = std::thread::current().id();
    let ran = std::sync::Mutex::new(Vec::new());
    cpu_kernels::team::for_each(64, |i| ran.lock().unwrap().push((i, std::thread::current().id())));
    let ran = ran.into_inner().unwrap();
    assert_eq!(ran.iter().map(|r| r.0).collect::<Vec<_>>(), (0..64).collect::<Vec<_>>(), "every index once, in order");
    assert!(ran.iter().all(|r| r.1 == caller), "a region left the calling thread");
    // Inside a team (a no-op with one thread) the same holds.
    let inside = cpu_kernels::team::with_team(|| {
        let mut v = vec![0usize; 100];
        cpu_kernels::team::chunks_mut(&mut v, 7, |i, c| c.iter_mut().for_each(|x| *x = i));
        (std::thread::current().id(), v)
    });
    assert_eq!(inside.0, caller);
    assert!(inside.1.iter().enumerate().all(|(j, &i)| i == j / 7));
}
