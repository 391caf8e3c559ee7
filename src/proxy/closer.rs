// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The closer: where a connection's frontend descriptors are closed.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

/// Where a connection's frontend descriptors are closed: a thread of the
/// connection's own (`vuc-closer`), not waited for. If closing one blocks,
/// only that thread waits, and the descriptors behind it stay open until
/// it is done; the request pump, the teardown and later connections go
/// on. What that can hold is bounded: past [`MAX_PENDING_CLOSES`] of its
/// own connection waiting, the request pump ends that connection; and the
/// daemon does not serve another one while more than that many wait
/// daemon-wide ([`pending_closes`]; or it exits with status 3, see
/// `daemon::serve_stream`).
#[derive(Clone, Debug)]
pub struct Closer {
    tx: mpsc::Sender<OwnedFd>,
    /// This connection's descriptors not closed yet.
    mine: Arc<AtomicUsize>,
}

/// Frontend descriptors handed to closer threads and not closed yet, in
/// the whole daemon.
static PENDING_CLOSES: AtomicUsize = AtomicUsize::new(0);

/// Most frontend descriptors that may wait to be closed, per connection
/// (more end it) and daemon-wide (more hold up the next connection). An
/// honest frontend's are closed as they come; each one waiting stays open
/// in the daemon, and so does the thread it waits on.
pub const MAX_PENDING_CLOSES: usize = 256;

/// Frontend descriptors handed to closer threads ([`Closer`]) and not
/// closed yet, daemon-wide.
pub fn pending_closes() -> usize {
    PENDING_CLOSES.load(Ordering::Relaxed)
}

impl Closer {
    /// Starts the closer thread. It ends once every `Closer` is dropped and
    /// it has closed what it was given.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start() -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<OwnedFd>();
        let mine = Arc::new(AtomicUsize::new(0));
        let left = mine.clone();
        thread::Builder::new().name("vuc-closer".into()).spawn(move || {
            for fd in rx {
                drop(fd);
                left.fetch_sub(1, Ordering::Relaxed);
                PENDING_CLOSES.fetch_sub(1, Ordering::Relaxed);
            }
        })?;
        Ok(Closer { tx, mine })
    }

    /// This connection's descriptors handed over and not closed yet.
    pub(super) fn pending(&self) -> usize {
        self.mine.load(Ordering::Relaxed)
    }

    /// Hands `fd` to the closer thread (or, if that thread is gone, which
    /// cannot happen while a `Closer` exists, drops it here).
    pub(super) fn close(&self, fd: OwnedFd) {
        self.mine.fetch_add(1, Ordering::Relaxed);
        PENDING_CLOSES.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(fd)) = self.tx.send(fd) {
            self.mine.fetch_sub(1, Ordering::Relaxed);
            PENDING_CLOSES.fetch_sub(1, Ordering::Relaxed);
            drop(fd);
        }
    }
}
