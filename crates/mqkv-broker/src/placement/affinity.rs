//! Which CPUs a thread may run on.
//!
//! Connection threads can be pinned one to a CPU (see [`crate::BrokerConfig`]). Left to
//! themselves, a scheduler that packs runnable threads onto few CPUs (as virtual machines' guest
//! kernels may be set up to) puts the connection threads on one CPU whenever the other is idle
//! for a moment, for instance while the state store's log thread waits for the disk, and the
//! idle CPU then stays idle while the busy one has a queue.

/// The CPUs the calling thread may run on, in ascending order; empty where that cannot be
/// read (or on systems without CPU affinity).
#[cfg(target_os = "linux")]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeroes is a valid value, and
    // `sched_getaffinity` writes at most the size it is given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    let size = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    // SAFETY: `cpu` is below CPU_SETSIZE, the number of bits in `set`.
    (0..size)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// Restricts the calling thread to `cpu`.
pub(crate) fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    set_current_thread_cpus(&[cpu])
}

/// Lets the calling thread run on `cpus` (and nowhere else).
#[cfg(target_os = "linux")]
pub(crate) fn set_current_thread_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let size = usize::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    if cpus.is_empty() || cpus.iter().any(|&cpu| cpu >= size) {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: as in `allowed_cpus`; every cpu was checked against the set's size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_current_thread_cpus(_cpus: &[usize]) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Puts the calling thread under the kernel's batch policy (`SCHED_BATCH`): when it is woken
/// (a packet arrived, a write completed), it waits for the running thread to use up its time
/// slice or sleep instead of preempting it at once. A load generator or client sharing the
/// CPU then sends more before the connection thread runs, and the connection thread finds
/// more to do in each pass, with fewer switches between them.
#[cfg(target_os = "linux")]
pub(crate) fn batch_current_thread() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Elsewhere the policy does not exist: there is nothing to ask for.
#[cfg(not(target_os = "linux"))]
pub(crate) fn batch_current_thread() -> std::io::Result<()> {
    Ok(())
}

/// Whether the calling thread runs under the batch policy (see [`batch_current_thread`]).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn current_thread_is_batch() -> bool {
    // SAFETY: no arguments but the calling thread's pid 0.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_BATCH }
}

/// The CPU for each of `threads` connection threads when pinning is asked for: the i-th of the
/// `allowed` CPUs for thread i, or none at all when there are more threads than CPUs (they
/// would have to share) or only one CPU (nothing to choose).
pub(crate) fn plan(threads: usize, allowed: &[usize]) -> Option<Vec<usize>> {
    (allowed.len() > 1 && threads <= allowed.len()).then(|| allowed[..threads].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cpu_per_thread_in_order_of_the_allowed_ones() {
        assert_eq!(plan(2, &[0, 1]), Some(vec![0, 1]));
        assert_eq!(plan(2, &[2, 5, 7]), Some(vec![2, 5]));
        assert_eq!(plan(1, &[3, 4]), Some(vec![3]));
    }

    #[test]
    fn no_pinning_with_more_threads_than_cpus_or_a_single_cpu() {
        assert_eq!(plan(3, &[0, 1]), None);
        assert_eq!(plan(1, &[0]), None);
        assert_eq!(plan(2, &[]), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_calling_threads_cpus_are_read() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "a thread may run somewhere");
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "ascending: {cpus:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        let cpus = allowed_cpus();
        let last = *cpus.last().expect("some cpu");
        let seen = std::thread::spawn(move || {
            pin_current_thread(last).expect("pin");
            allowed_cpus()
        })
        .join()
        .expect("thread");
        assert_eq!(seen, vec![last]);
        // Other threads keep their CPUs.
        assert_eq!(allowed_cpus(), cpus);
        assert!(pin_current_thread(usize::MAX).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_can_be_given_back_every_cpu() {
        let cpus = allowed_cpus();
        let first = *cpus.first().expect("some cpu");
        let seen = std::thread::spawn(move || {
            pin_current_thread(first).expect("pin");
            let pinned = allowed_cpus();
            set_current_thread_cpus(&cpus).expect("unpin");
            (pinned, allowed_cpus())
        })
        .join()
        .expect("thread");
        assert_eq!(seen.0, vec![first]);
        assert_eq!(seen.1, allowed_cpus());
        assert!(set_current_thread_cpus(&[]).is_err());
    }
}
