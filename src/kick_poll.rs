// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Data rings without a kick eventfd: a `SET_VRING_KICK` with
//! `VHOST_USER_VRING_NOFD_MASK` (bit 8 of its u64) asks the backend to
//! poll the ring instead of waiting for kicks (QEMU
//! `docs/interop/vhost-user.rst`, "VHOST_USER_SET_VRING_KICK": "This
//! signals that polling should be used instead of waiting for the kick").
//!
//! Such a ring gets a periodic timerfd ([`POLL_PERIOD`], non-blocking) in
//! place of a kick eventfd: the queue's worker thread watches it as it
//! watches a kick eventfd (`crate::backend`, the kick event id), so it
//! looks at the ring once per period and sleeps in between; a look that
//! finds requests serves them as a kick would (batches, then the busy-poll
//! time). The worker only reads the timerfd (`read` or `preadv2`, both on
//! its system-call allow-list, `crate::seccomp`). A kick eventfd from a
//! later `SET_VRING_KICK` ends the polling ([`KickPolls::stop`]); so does
//! the end of the connection (dropping [`KickPolls`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, info};

/// How long the worker of a polled ring sleeps between two looks at it.
pub const POLL_PERIOD: Duration = Duration::from_millis(1);

/// The polling timers of one connection's data rings.
#[derive(Debug, Default)]
pub struct KickPolls {
    /// Per data ring: its timer while it is polled.
    timers: Vec<Option<Arc<File>>>,
    /// Whether a polled ring was logged at info on this connection.
    logged: bool,
}

impl KickPolls {
    /// Starts polling data ring `index` (a `SET_VRING_KICK` without an
    /// eventfd): returns the timer for the worker to watch in place of a
    /// kick eventfd. A timer the ring had already is stopped. The first
    /// polled ring of a connection is logged at info, the others at debug.
    ///
    /// # Errors
    /// Creating or arming the timerfd failed (host-side).
    pub fn start(&mut self, index: usize) -> io::Result<Arc<File>> {
        self.stop(index);
        let timer = Arc::new(periodic_timer(POLL_PERIOD)?);
        if self.timers.len() <= index {
            self.timers.resize(index + 1, None);
        }
        self.timers[index] = Some(timer.clone());
        if std::mem::replace(&mut self.logged, true) {
            debug!("data ring {index} has no kick eventfd (VRING_NOFD_MASK): polled");
        } else {
            info!(
                "data ring {index} has no kick eventfd (VRING_NOFD_MASK): polled every {POLL_PERIOD:?} \
                 until one comes (further polled rings on this connection are logged at debug)"
            );
        }
        Ok(timer)
    }

    /// Stops polling data ring `index`; whether it was polled.
    pub fn stop(&mut self, index: usize) -> bool {
        match self.timers.get_mut(index).and_then(Option::take) {
            Some(t) => {
                disarm(&t);
                true
            }
            None => false,
        }
    }
}

impl Drop for KickPolls {
    fn drop(&mut self) {
        // The worker's epoll may still hold a timer (the backend keeps its
        // copy until the connection's teardown): it fires no more.
        for t in self.timers.iter().flatten() {
            disarm(t);
        }
    }
}

/// A non-blocking `CLOCK_MONOTONIC` timerfd that expires every `period`
/// (timerfd_create(2)).
///
/// # Errors
/// `timerfd_create` or `timerfd_settime` failed.
fn periodic_timer(period: Duration) -> io::Result<File> {
    // SAFETY: timerfd_create with a clock id and flags; the result is
    // checked.
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    let ts = libc::timespec {
        tv_sec: period.as_secs() as libc::time_t,
        tv_nsec: period.subsec_nanos() as libc::c_long,
    };
    set_time(&file, ts)?;
    Ok(file)
}

/// Disarms a timer (a zero `it_value`); a failure is only logged (the
/// timer is then dropped with its ring's kick).
fn disarm(timer: &File) {
    if let Err(e) = set_time(
        timer,
        libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
    ) {
        debug!("disarming a ring's polling timer failed: {e}");
    }
}

/// `timerfd_settime` with `it_value` = `it_interval` = `ts` (relative).
fn set_time(timer: &File, ts: libc::timespec) -> io::Result<()> {
    let spec = libc::itimerspec {
        it_interval: ts,
        it_value: ts,
    };
    // SAFETY: timerfd_settime on a timerfd we own, reading `spec` and
    // writing no old value (null).
    let r = unsafe { libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Instant;

    #[test]
    fn a_polled_ring_ticks_until_stopped() {
        let mut polls = KickPolls::default();
        let t = polls.start(3).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 8];
        // Expires within a few periods (wide bound for a busy machine).
        while (&*t).read(&mut buf).is_err() {
            assert!(start.elapsed() < Duration::from_secs(2), "no expiry");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(u64::from_ne_bytes(buf) >= 1);
        assert!(polls.stop(3));
        assert!(!polls.stop(3));
        let _ = (&*t).read(&mut buf);
        std::thread::sleep(POLL_PERIOD * 20);
        // Disarmed: nothing to read (EAGAIN).
        let e = (&*t).read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
