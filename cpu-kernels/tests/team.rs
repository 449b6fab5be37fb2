//! The spinning team (`cpu_kernels::team`): every index of every region runs exactly once,
//! inside and outside a team, nested regions run, panics reach the caller without wedging
//! the pool, and concurrent teams from several threads neither deadlock nor mix regions.

use cpu_kernels::team::{chunks_mut, for_each, leading, try_chunks_mut, with_team};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn pool() {
    // Three threads whatever the machine, so a team always has followers.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(3).build_global();
}

fn counts_once(n: usize) {
    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
    for_each(n, |i| {
        hits[i].fetch_add(1, Relaxed);
    });
    assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
}

#[test]
fn every_index_once_in_and_out_of_a_team() {
    pool();
    for n in [0, 1, 2, 3, 17, 24, 1000, 100_000] {
        counts_once(n);
        with_team(|| {
            assert!(leading());
            // Many regions in a row: the generation protocol must not let a late thread run
            // a task of an old region with a new closure.
            for _ in 0..50 {
                counts_once(n);
            }
        });
    }
    assert!(!leading());
}

#[test]
fn nested_regions_run_serially_inside_a_task() {
    pool();
    let total = AtomicUsize::new(0);
    with_team(|| {
        for_each(8, |_| {
            for_each(10, |_| {
                total.fetch_add(1, Relaxed);
            });
        });
    });
    assert_eq!(total.load(Relaxed), 80);
}

#[test]
fn chunks_are_disjoint_and_complete() {
    pool();
    for (len, size) in [(0, 4), (1, 4), (10, 3), (4096, 64), (1000, 1000), (999, 1)] {
        let mut v = vec![usize::MAX; len];
        with_team(|| chunks_mut(&mut v, size, |i, c| c.iter_mut().for_each(|x| *x = i)));
        assert!(v.iter().enumerate().all(|(j, &x)| x == j / size), "len {len} size {size}");
    }
    let mut v = vec![0u8; 100];
    let r: Result<(), String> = with_team(|| {
        try_chunks_mut(&mut v, 10, |i, c| {
            c.fill(1);
            if i == 7 { Err(format!("chunk {i}")) } else { Ok(()) }
        })
    });
    assert_eq!(r, Err("chunk 7".into()));
    assert!(v.iter().all(|&x| x == 1), "every chunk ran despite the error");
}

#[test]
fn a_panicking_task_reaches_the_caller_and_the_pool_still_works() {
    pool();
    let r = std::panic::catch_unwind(|| {
        with_team(|| {
            for_each(64, |i| {
                if i == 33 {
                    panic!("task 33");
                }
            })
        })
    });
    assert!(r.is_err());
    assert!(!leading());
    let r = std::panic::catch_unwind(|| with_team(|| panic!("leader")));
    assert!(r.is_err());
    // The followers were released both times.
    assert_eq!(
        with_team(|| {
            counts_once(500);
            7
        }),
        7
    );
}

#[test]
fn concurrent_teams_from_several_threads() {
    pool();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let sum = AtomicUsize::new(0);
                for _ in 0..20 {
                    with_team(|| {
                        for_each(1000, |i| {
                            sum.fetch_add(i + t, Relaxed);
                        })
                    });
                }
                sum.load(Relaxed)
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), 20 * (999 * 1000 / 2 + 1000 * t));
    }
}
