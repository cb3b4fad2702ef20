//! A shorter CPU time slice for the scheduler's thread, so that it runs soon after its timer
//! fires on a busy machine.
//!
//! Linux's fair scheduler (EEVDF, since 6.6) gives every thread a virtual deadline of its
//! eligible time plus its slice; a waking thread preempts the running one when its deadline is
//! earlier. Since Linux 6.12 a normal (`SCHED_OTHER`) thread may ask for its own slice with
//! `sched_setattr`'s `sched_runtime` (0.1-100 ms), without any privilege. A slice of its own
//! does not give the thread a larger share of the CPU (its weight, the nice value, stays), only
//! an earlier turn: the scheduler thread runs for about 30 us per wake and sleeps to the next
//! due millisecond, which is the work that shape suits. The broker asks for 1 ms unless told
//! otherwise (`--scheduler-slice`); BENCHMARKS.md, section 4, has what each slice costs and
//! gains.
//!
//! Older kernels ignore `sched_runtime` for normal threads; [`request`] then reports `None`.
//! This is the crate's only `unsafe` code: two system calls on a `#[repr(C)]` struct that the
//! kernel reads and writes within the size passed with it.
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

/// The shortest slice the kernel grants (`--scheduler-slice 100us`).
pub const SHORTEST: Duration = Duration::from_micros(100);

/// The longest slice the kernel grants.
pub const LONGEST: Duration = Duration::from_millis(100);

/// `struct sched_attr` as of its first version (48 bytes), which every kernel since 3.14 takes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const SCHED_OTHER: u32 = 0;

fn get(tid: i32) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as libc::c_uint;
    // SAFETY: the kernel writes at most `size` bytes into `attr`, which is that large.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            size,
            0 as libc::c_uint,
        )
    };
    if r == 0 {
        Ok(attr)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set(tid: i32, attr: &SchedAttr) -> io::Result<()> {
    // SAFETY: the kernel reads `attr.size` bytes from `attr`, which is that large.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            attr as *const SchedAttr,
            0 as libc::c_uint,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The time slice of thread `tid` (0: the calling thread) as the kernel reports it: `None` on a
/// kernel that reports none for normal threads (before 6.12), or for a thread that is not a
/// normal one.
///
/// # Errors
/// The `sched_getattr` error (no such thread, or no such system call).
pub fn of(tid: i32) -> io::Result<Option<Duration>> {
    let attr = get(tid)?;
    Ok(
        (attr.policy == SCHED_OTHER && attr.runtime > 0)
            .then(|| Duration::from_nanos(attr.runtime)),
    )
}

/// Asks for `slice` for the calling thread, keeping its policy and nice value, and returns the
/// slice the kernel reports afterwards if it is the one asked for (`None`: the kernel ignores
/// the request, or the thread is not a normal one and was left alone).
///
/// # Errors
/// The `sched_getattr` or `sched_setattr` error.
pub fn request(slice: Duration) -> io::Result<Option<Duration>> {
    let mut attr = get(0)?;
    if attr.policy != SCHED_OTHER {
        return Ok(None);
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.flags = 0;
    attr.runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    set(0, &attr)?;
    Ok(of(0)?.filter(|now| *now == slice))
}

/// The thread ids of this process's threads named `name`.
///
/// # Errors
/// Reading `/proc/self/task`.
pub fn threads_named(name: &str) -> io::Result<Vec<i32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        let entry = entry?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A thread may end between the listing and the read.
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            if comm.trim_end() == name {
                ids.push(tid);
            }
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice_value() {
        std::thread::spawn(|| {
            // A nice value other than the default, which the request must not reset.
            let mut niced = get(0).unwrap();
            niced.size = std::mem::size_of::<SchedAttr>() as u32;
            niced.nice = 5;
            set(0, &niced).unwrap();
            // A kernel that reports slices (6.12 and later) applies the requests.
            let reports = of(0).unwrap().is_some();
            let longer = request(Duration::from_millis(1)).unwrap();
            let shorter = request(SHORTEST).unwrap();
            let after = get(0).unwrap();
            assert_eq!((after.policy, after.nice), (SCHED_OTHER, 5));
            if reports {
                assert_eq!(longer, Some(Duration::from_millis(1)));
                assert_eq!(shorter, Some(SHORTEST));
                assert_eq!(of(0).unwrap(), Some(SHORTEST));
            } else {
                assert_eq!((longer, shorter), (None, None));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_slice_of_another_thread_is_read_by_its_id() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("slice-probe".into())
            .spawn(move || {
                tx.send(request(SHORTEST).unwrap()).unwrap();
                done_rx.recv().unwrap();
            })
            .unwrap();
        let asked = rx.recv().unwrap();
        let ids = threads_named("slice-probe").unwrap();
        assert_eq!(ids.len(), 1, "{ids:?}");
        assert_eq!(of(ids[0]).unwrap(), asked);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(threads_named("slice-probe").unwrap().is_empty());
    }
}
