// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The session tables alive in the process, so that the keys of every
//! connection's sessions can be zeroized before the process exits on
//! SIGTERM or SIGINT (`signals.rs`), while queue workers may still run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use super::TableShared;

/// A list of live session tables (weak references: a table leaves it when
/// its connection drops it), and whether they were wiped.
#[derive(Debug)]
pub struct LiveTables {
    /// Set once by [`LiveTables::wipe_all`]: from then on the tables drop
    /// what the registry posts to them, and queue workers take no request
    /// (`SessionTable::is_wiped`, read under the sessions lock).
    closed: AtomicBool,
    tables: Mutex<Vec<Weak<TableShared>>>,
}

/// The process's list: every [`super::SessionTable::new`] is in it.
static LIVE_TABLES: LiveTables = LiveTables::new();

/// The process's list of live session tables.
pub fn live_tables() -> &'static LiveTables {
    &LIVE_TABLES
}

/// What [`LiveTables::wipe_all`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wiped {
    /// Tables emptied.
    pub tables: usize,
    /// Sessions dropped from them (a session is in every table of its
    /// connection, and counts once per table), posted ones included.
    pub sessions: usize,
    /// Tables left as they were: a queue's batch held the table's lock
    /// until the time given was up.
    pub busy: usize,
}

impl Default for LiveTables {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveTables {
    /// An empty list.
    pub const fn new() -> Self {
        LiveTables {
            closed: AtomicBool::new(false),
            tables: Mutex::new(Vec::new()),
        }
    }

    /// Whether [`LiveTables::wipe_all`] has run (checked under a table's
    /// posts lock by a post, under its sessions lock by a queue worker).
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Adds `table` (once per table, when a connection starts), forgetting
    /// the tables dropped since.
    pub(super) fn register(&self, table: &Arc<TableShared>) {
        let mut v = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(table));
    }

    /// Number of tables alive.
    pub fn len(&self) -> usize {
        let v = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().filter(|w| w.strong_count() > 0).count()
    }

    /// Whether no table is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties every live table, and what was posted to it and not yet
    /// applied: each session dropped zeroizes its key schedule and its
    /// whole box (`SessionBox`). Meant for the end of the process: the
    /// tables stay usable but drop whatever is posted to them later, so
    /// that a CREATE the frontend sends meanwhile leaves no key behind
    /// (the flag is set before any table's posts lock is taken here, and
    /// `SessionTable::post` reads it under that lock, so a post
    /// is either wiped here or dropped there). A CLOSE waiting for its
    /// removal to be applied sees it applied.
    ///
    /// A queue worker holds its table's lock for one batch at a time,
    /// leaves its locks free between batches (`backend::lock_gap_if_due`),
    /// and takes no request in a batch that finds the flag set
    /// (`SessionTable::is_wiped`); a table still locked after `within` (a
    /// worker blocked on guest memory the frontend made block) is left as
    /// it is and counted in [`Wiped::busy`].
    ///
    /// Lock order (docs/ARCHITECTURE.md, "Locks"): the list's lock alone;
    /// then each table's session map, then its posts.
    pub fn wipe_all(&self, within: Duration) -> Wiped {
        self.closed.store(true, Ordering::SeqCst);
        let tables: Vec<Arc<TableShared>> = {
            let v = self.tables.lock().unwrap_or_else(|e| e.into_inner());
            v.iter().filter_map(Weak::upgrade).collect()
        };
        let deadline = Instant::now() + within;
        let mut wiped = Wiped::default();
        for t in tables {
            let mut sessions = loop {
                match t.sessions.try_lock() {
                    Ok(s) => break Some(s),
                    Err(TryLockError::Poisoned(e)) => break Some(e.into_inner()),
                    Err(TryLockError::WouldBlock) if Instant::now() >= deadline => break None,
                    Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_micros(50)),
                }
            };
            let Some(sessions) = sessions.as_mut() else {
                wiped.busy += 1;
                continue;
            };
            let mut posts = t.posts.lock().unwrap_or_else(|e| e.into_inner());
            let n = posts.len();
            wiped.sessions += sessions.map.len()
                + posts
                    .iter()
                    .filter(|u| matches!(u, super::Update::Insert(..)))
                    .count();
            posts.clear();
            sessions.map.clear();
            t.applied.fetch_add(n as u64, Ordering::Release);
            wiped.tables += 1;
        }
        wiped
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    fn info() -> SymSessionInfo {
        let mut i = SymSessionInfo {
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len: 16,
            op_type: 1,
            direction: 1,
            ..Default::default()
        };
        i.cipher_key[..16].copy_from_slice(&[0x2b; 16]);
        i
    }

    fn list() -> &'static LiveTables {
        Box::leak(Box::new(LiveTables::new()))
    }

    fn posts(t: &SessionTable) -> usize {
        t.shared.posts.lock().unwrap().len()
    }

    /// Every live table is emptied, what was posted and not applied too;
    /// a CREATE after the wipe leaves nothing in any table.
    #[test]
    fn wipe_all_empties_every_live_table_and_its_posts() {
        let live = list();
        let (mut a, ta) = session_set_in(8, 2, Arc::new(AtomicU64::new(1)), live);
        let (mut b, tb) = session_set_in(8, 1, Arc::new(AtomicU64::new(1)), live);
        assert_eq!(live.len(), 3);
        assert_eq!(a.create(&info()), 1);
        {
            // A batch of queue 1 holds its table: the second CREATE is
            // only posted there.
            let _batch = ta[1].shared.sessions.lock().unwrap();
            assert_eq!(a.create(&info()), 2);
        }
        assert_eq!(b.create(&info()), 1);
        assert_eq!(
            (ta[0].shared.sessions.lock().unwrap().len(), posts(&ta[0])),
            (2, 0)
        );
        assert_eq!(
            (ta[1].shared.sessions.lock().unwrap().len(), posts(&ta[1])),
            (1, 1)
        );

        let wiped = live.wipe_all(Duration::from_secs(1));
        assert_eq!(
            wiped,
            Wiped {
                tables: 3,
                sessions: 5,
                busy: 0
            }
        );
        for t in ta.iter().chain(&tb) {
            assert_eq!((t.shared.sessions.lock().unwrap().len(), posts(t)), (0, 0));
        }
        // Later CREATEs are dropped, and a CLOSE does not wait for ever.
        assert_eq!(a.create(&info()), 3);
        assert!(a.close(1));
        for t in &ta {
            assert!(t.is_empty());
            assert_eq!(posts(t), 0);
        }
    }

    /// Tables dropped with their connection leave the list; the others
    /// stay in it.
    #[test]
    fn dropped_tables_leave_the_list() {
        let live = list();
        let (reg, tables) = session_set_in(8, 4, Arc::new(AtomicU64::new(1)), live);
        let (_reg2, _tables2) = session_set_in(8, 1, Arc::new(AtomicU64::new(1)), live);
        assert_eq!(live.len(), 5);
        drop((reg, tables));
        assert_eq!(live.len(), 1);
        assert_eq!(live.wipe_all(Duration::ZERO).tables, 1);
    }

    /// A table a batch keeps locked is left after the time given, and
    /// the others are wiped.
    #[test]
    fn a_table_locked_past_the_deadline_is_counted_busy() {
        let live = list();
        let (mut reg, tables) = session_set_in(8, 2, Arc::new(AtomicU64::new(1)), live);
        assert_eq!(reg.create(&info()), 1);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let batch = {
            let t = tables[0].clone();
            std::thread::spawn(move || {
                let _s = t.lock();
                locked_tx.send(()).unwrap();
                let _ = done_rx.recv_timeout(Duration::from_secs(10));
            })
        };
        locked_rx.recv().unwrap();
        let started = Instant::now();
        let wiped = live.wipe_all(Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(5));
        done_tx.send(()).unwrap();
        batch.join().unwrap();
        assert_eq!(
            wiped,
            Wiped {
                tables: 1,
                sessions: 1,
                busy: 1
            }
        );
        assert!(tables[1].is_empty());
        assert_eq!(tables[0].len(), 1, "left as it was");
    }
}
