// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The queue path in-process: a split ring in real guest memory
//! (`GuestMemoryMmap`) with 256 AES-128-CBC requests per batch, each one
//! indirect table (as Linux sends them), processed by
//! `QueueWorker::process`: descriptor walk, validation, cipher on guest
//! memory, used ring. Sizes 64 B to 16 KiB, encrypt and decrypt.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use vhost_crypto_replay::driver_ring::{encode, Descriptor, F_INDIRECT, F_NEXT, F_WRITE};
use vhost_user_crypto::crypto::RequestLimits;
use vhost_user_crypto::sessions::session_set;
use vhost_user_crypto::virtq::ring::RingAddrs;
use vhost_user_crypto::wire::session::SymSessionInfo;
use vhost_user_crypto::wire::virtio_crypto::OpDataReq;
use vhost_user_crypto::worker::QueueWorker;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const QSIZE: u16 = 256;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x3000;
const USED: u64 = 0x4000;
const BUFS: u64 = 0x10_0000;

struct Bench {
    mem: GuestMemoryMmap<()>,
    worker: QueueWorker,
    next_avail: u16,
    next_used: u16,
    avail_idx: u16,
}

fn setup(size: usize, opcode: u32) -> Bench {
    let slot = (72 + 16 + 2 * size + 1 + 5 * 16).next_multiple_of(4096) as u64;
    let mem =
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), (BUFS + slot * u64::from(QSIZE)) as usize)])
            .unwrap();
    let (mut reg, mut tables) = session_set(16, 1);
    let mut info = SymSessionInfo::aes_cbc(&[0x2b; 16], 1);
    assert_eq!(reg.create(&info), 1);
    info.direction = 2;
    assert_eq!(reg.create(&info), 2);
    let worker = QueueWorker::new(
        tables.pop().unwrap(),
        RequestLimits {
            max_request_bytes: 1 << 20,
        },
    );
    let sid = if opcode == 0 { 1 } else { 2 };
    for i in 0..u64::from(QSIZE) {
        let base = BUFS + i * slot;
        let hdr = OpDataReq {
            opcode,
            algo: 0,
            session_id: sid,
            op_type: 1,
            iv_len: 16,
            src_data_len: size as u32,
            dst_data_len: size as u32,
        };
        mem.write_slice(&hdr.to_bytes(), GuestAddress(base)).unwrap();
        let (iv, src, dst, st, table) = (
            base + 72,
            base + 88,
            base + 88 + size as u64,
            base + 88 + 2 * size as u64,
            (base + 89 + 2 * size as u64).next_multiple_of(16),
        );
        let descs = [
            (base, 72, 0),
            (iv, 16, 0),
            (src, size as u32, 0),
            (dst, size as u32, F_WRITE),
            (st, 1, F_WRITE),
        ];
        for (j, &(addr, len, flags)) in descs.iter().enumerate() {
            let last = j == descs.len() - 1;
            let d = Descriptor::new(
                addr,
                len,
                flags | if last { 0 } else { F_NEXT },
                if last { 0 } else { j as u16 + 1 },
            );
            mem.write_slice(&encode(&d), GuestAddress(table + 16 * j as u64))
                .unwrap();
        }
        let head = Descriptor::new(table, 80, F_INDIRECT, 0);
        mem.write_slice(&encode(&head), GuestAddress(DESC + 16 * i))
            .unwrap();
        mem.write_obj(i as u16, GuestAddress(AVAIL + 4 + 2 * i)).unwrap();
    }
    Bench {
        mem,
        worker,
        next_avail: 0,
        next_used: 0,
        avail_idx: 0,
    }
}

impl Bench {
    /// Makes all QSIZE requests available again and processes them, one
    /// batch (at most `MAX_BATCH` chains) per `process` call, as the
    /// daemon's worker does.
    fn batch(&mut self) {
        self.avail_idx = self.avail_idx.wrapping_add(QSIZE);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        let addrs = RingAddrs {
            size: QSIZE,
            desc: DESC,
            avail: AVAIL,
            used: USED,
        };
        let mut done = 0;
        while done < u32::from(QSIZE) {
            let r = self
                .worker
                .process(&self.mem, addrs, &mut self.next_avail, &mut self.next_used);
            assert!(r.completed > 0, "no progress after {done} requests");
            done += r.completed;
        }
        assert_eq!(done, u32::from(QSIZE));
    }
}

fn queue_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue-256-requests");
    for size in [64usize, 256, 1024, 4096, 16384] {
        g.throughput(Throughput::Elements(u64::from(QSIZE)));
        for (name, opcode) in [("encrypt", 0u32), ("decrypt", 1)] {
            let mut b = setup(size, opcode);
            g.bench_with_input(BenchmarkId::new(name, size), &size, |bn, _| {
                bn.iter_batched(|| (), |_| b.batch(), BatchSize::SmallInput)
            });
        }
    }
    g.finish();
}

criterion_group!(benches, queue_path);
criterion_main!(benches);
