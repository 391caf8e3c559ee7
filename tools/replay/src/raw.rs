// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Raw descriptor-level requests: the trace line
//!
//! ```text
//! {"op":"raw",
//!  "header":{"opcode":0,"session":"e","iv_len":16,"src_len":64,"dst_len":64},
//!  "descriptors":[{"at":0,"len":72,"data":"header"},
//!                 {"at":128,"len":16,"data":"000102030405060708090a0b0c0d0e0f"},
//!                 {"at":256,"len":64,"data":"<hex>"},
//!                 {"addr":18446744073709551360,"len":64,"write":true},
//!                 {"at":512,"len":1,"write":true}],
//!  "expect":{"status":"err","used_len":1,"untouched":true}}
//! ```
//!
//! lays out exactly the descriptors given, for the hostile-guest cases:
//! `at` is an offset in the request's scratch area, `addr` an absolute
//! guest-physical address; `data` is hex, `"header"` (the 72-byte header
//! built from `header`) or `"header[A..B]"` (a slice of it); writable
//! descriptors in the scratch area are filled with a canary first. Each
//! descriptor is chained to the next (`VRING_DESC_F_NEXT`) unless `flags`
//! (raw `VRING_DESC_F_*`) and `next` (relative to the request's first
//! descriptor) are given. The descriptors go in one indirect table, or,
//! with `"indirect": false` on a queue run with `--descriptors chain`, in a
//! direct chain of at most 6 descriptors (`DESCS_PER_REQUEST`).
//!
//! `expect`: `status` (omit it for a chain that must be *consumed*: used
//! length 0 and no status written), `used_len`, optional `dst` (the first
//! bytes of the writable stream of scratch-area descriptors), and
//! `untouched` (every writable scratch byte past `dst`, except the status
//! byte, keeps the canary). Raw requests run one at a time.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use vhost_user_crypto::wire::virtio_crypto::{OpDataReq, OP_DATA_REQ_SIZE, VIRTIO_CRYPTO_SYM_OP_CIPHER};

use crate::driver_ring::{Descriptor, F_NEXT, F_WRITE};
use crate::frontend::{CryptoFrontend, Error, Used, NO_SLOT};
use crate::replay::{DST_CANARY, STATUS_CANARY};
use crate::trace::{hex, unhex, ExpectStatus};

/// What the scratch bytes no descriptor puts data in hold while a raw
/// request runs.
const SCRATCH_CANARY: u8 = 0x3C;

/// Header fields of a raw request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeader {
    /// `header.opcode` (0 encrypt, 1 decrypt, anything else as is).
    pub opcode: u32,
    /// `header.algo`.
    #[serde(default)]
    pub algo: u32,
    /// Session name (its id is used).
    #[serde(default)]
    pub session: Option<String>,
    /// Raw session id.
    #[serde(default)]
    pub session_id: Option<u64>,
    /// `op_type` (default `VIRTIO_CRYPTO_SYM_OP_CIPHER`, 1).
    #[serde(default = "op_cipher")]
    pub op_type: u32,
    /// `iv_len`.
    pub iv_len: u32,
    /// `src_data_len`.
    pub src_len: u32,
    /// `dst_data_len`.
    pub dst_len: u32,
}

fn op_cipher() -> u32 {
    VIRTIO_CRYPTO_SYM_OP_CIPHER
}

/// One raw descriptor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDesc {
    /// Offset in the scratch area.
    #[serde(default)]
    pub at: Option<u64>,
    /// Absolute guest-physical address.
    #[serde(default)]
    pub addr: Option<u64>,
    /// Length.
    pub len: u32,
    /// Device-writable.
    #[serde(default)]
    pub write: bool,
    /// Contents for a readable scratch descriptor.
    #[serde(default)]
    pub data: Option<String>,
    /// Raw flags (overrides write/next chaining).
    #[serde(default)]
    pub flags: Option<u16>,
    /// Raw next index, relative to the first descriptor.
    #[serde(default)]
    pub next: Option<u16>,
}

/// Expected result of a raw request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExpect {
    /// Status; none = consumed.
    #[serde(default)]
    pub status: Option<ExpectStatus>,
    /// Used length.
    pub used_len: u32,
    /// Expected start of the writable stream, hex.
    #[serde(default)]
    pub dst: Option<String>,
    /// Writable scratch bytes other than the status keep the canary.
    #[serde(default)]
    pub untouched: bool,
}

/// A raw request line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReq {
    /// Header to build.
    #[serde(default)]
    pub header: Option<RawHeader>,
    /// Descriptors in chain order.
    pub descriptors: Vec<RawDesc>,
    /// Use an indirect table.
    #[serde(default)]
    pub indirect: Option<bool>,
    /// Data queue.
    #[serde(default)]
    pub queue: Option<u16>,
    /// Expectation.
    pub expect: RawExpect,
    /// Trace line (filled in by the parser).
    #[serde(skip)]
    pub line: usize,
}

impl RawReq {
    /// Bytes of scratch area the request needs.
    pub fn scratch_bytes(&self) -> u64 {
        self.descriptors
            .iter()
            .filter_map(|d| d.at.map(|a| a + u64::from(d.len)))
            .max()
            .unwrap_or(0)
    }

    /// Checks the line is usable.
    ///
    /// # Errors
    /// A message for the trace error.
    pub fn validate(&self) -> Result<(), String> {
        if self.descriptors.is_empty() {
            return Err("raw request without descriptors".into());
        }
        for d in &self.descriptors {
            if d.at.is_some() == d.addr.is_some() {
                return Err("each raw descriptor needs exactly one of at and addr".into());
            }
            if let Some(data) = &d.data {
                if !data.starts_with("header") {
                    unhex(data)?;
                }
            }
        }
        if self.scratch_bytes() > 16 << 20 {
            return Err("raw scratch area over 16 MiB".into());
        }
        Ok(())
    }
}

fn header_bytes(h: &RawHeader, sid: u64) -> [u8; OP_DATA_REQ_SIZE] {
    OpDataReq {
        opcode: h.opcode,
        algo: h.algo,
        session_id: sid,
        op_type: h.op_type,
        iv_len: h.iv_len,
        src_data_len: h.src_len,
        dst_data_len: h.dst_len,
    }
    .to_bytes()
}

fn data_bytes(spec: &str, hdr: &[u8; OP_DATA_REQ_SIZE]) -> Result<Vec<u8>, String> {
    if spec == "header" {
        return Ok(hdr.to_vec());
    }
    if let Some(range) = spec.strip_prefix("header[").and_then(|r| r.strip_suffix(']')) {
        let (a, b) = range.split_once("..").ok_or("header[A..B] expected")?;
        let a: usize = a.parse().map_err(|_| "bad header slice")?;
        let b: usize = b.parse().map_err(|_| "bad header slice")?;
        return hdr
            .get(a..b)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "header slice out of range".into());
    }
    unhex(spec)
}

/// What a raw request gave.
#[derive(Debug, Clone, Default)]
pub struct RawOutcome {
    /// Mismatches as (field, expected, got).
    pub mismatches: Vec<(String, String, String)>,
    /// The status byte, when the request has one in the scratch area and it
    /// was written.
    pub status: Option<u8>,
}

/// Runs one raw request.
///
/// # Errors
/// Transport failures, or a request that cannot be laid out.
pub fn run_raw(
    fe: &mut CryptoFrontend,
    r: &RawReq,
    session_id: impl Fn(&str) -> u64,
    timeout: Duration,
) -> Result<RawOutcome, Error> {
    let mut bad = Vec::new();
    let mut seen = None;
    let qn = usize::from(r.queue.unwrap_or(0));
    let Some(q) = fe.queues.get_mut(qn) else {
        bad.push(("queue".into(), format!("< {}", fe.queues.len()), qn.to_string()));
        return Ok(RawOutcome {
            mismatches: bad,
            status: None,
        });
    };
    let slot = loop {
        if let Some(s) = q.next_slot() {
            break s;
        }
        let mut sink = Vec::new();
        q.publish_and_kick()?;
        q.reap(&mut sink, timeout)?;
    };
    let layout = q.layout(slot);
    let base = layout.hdr;
    if base + r.scratch_bytes() > layout.table {
        return Err(Error::Raw(format!(
            "scratch area of {} bytes does not fit the slot",
            r.scratch_bytes()
        )));
    }
    let sid = r
        .header
        .as_ref()
        .map(|h| {
            h.session_id
                .unwrap_or_else(|| h.session.as_deref().map_or(0, &session_id))
        })
        .unwrap_or(0);
    let hdr = r
        .header
        .as_ref()
        .map(|h| header_bytes(h, sid))
        .unwrap_or([0; OP_DATA_REQ_SIZE]);
    let n = r.descriptors.len();
    let mut descs = Vec::with_capacity(n);
    let mut status_at = None;
    let mut writable = Vec::new();
    // Every scratch byte no descriptor gives data to holds a canary, so
    // that a write anywhere outside the writable buffers shows (below);
    // also the 16 bytes after the scratch area where the slot has them
    // (after a status byte that ends it).
    let scratch = (r.scratch_bytes() + 16).min(layout.table - base) as usize;
    q.mem().fill(base, scratch, SCRATCH_CANARY);
    for (i, d) in r.descriptors.iter().enumerate() {
        let addr = d.at.map_or(d.addr.unwrap_or(0), |a| base + a);
        if let Some(a) = d.at {
            if d.write {
                q.mem().fill(base + a, d.len as usize, DST_CANARY);
                if d.len > 0 {
                    writable.push((base + a, d.len as usize));
                }
            } else if let Some(data) = &d.data {
                let bytes = data_bytes(data, &hdr).map_err(Error::Raw)?;
                q.mem().write(base + a, &bytes[..bytes.len().min(d.len as usize)]);
            }
        }
        if d.write && d.len > 0 {
            status_at = d.at.map(|a| base + a + u64::from(d.len) - 1);
        }
        let last = i + 1 == n;
        let flags = d
            .flags
            .unwrap_or(if d.write { F_WRITE } else { 0 } | if last { 0 } else { F_NEXT });
        let next = d.next.unwrap_or(if last { 0 } else { i as u16 + 1 });
        descs.push(Descriptor::new(addr, d.len, flags, next));
    }
    if let Some(s) = status_at {
        q.mem().write(s, &[STATUS_CANARY]);
    }
    let put = q.mem().view(base, scratch).to_vec();
    let indirect = r.indirect.unwrap_or(true);
    q.submit_descs(slot, &descs, indirect).map_err(Error::Raw)?;
    q.publish_and_kick()?;
    let mut done: Vec<Used> = Vec::new();
    while !done.iter().any(|u| u.slot == slot) {
        q.reap(&mut done, timeout)?;
        if q.in_flight() == 0 && !done.iter().any(|u| u.slot == slot) {
            break;
        }
    }
    for u in done.iter().filter(|u| u.slot == NO_SLOT) {
        bad.push((
            "used id".into(),
            "the head of a request in flight".into(),
            format!("{} (used length {})", u.id, u.len),
        ));
    }
    let Some(u) = done.iter().find(|u| u.slot == slot) else {
        bad.push(("completion".into(), "used element".into(), "none".into()));
        return Ok(RawOutcome {
            mismatches: bad,
            status: None,
        });
    };
    if u.len != r.expect.used_len {
        bad.push((
            "used length".into(),
            r.expect.used_len.to_string(),
            u.len.to_string(),
        ));
    }
    if let Some(s) = status_at {
        let got = q.mem().read_u8(s);
        seen = (got != STATUS_CANARY).then_some(got);
        match r.expect.status {
            Some(want) if got != want.byte() => bad.push((
                "status".into(),
                ExpectStatus::name(want.byte()),
                ExpectStatus::name(got),
            )),
            None if got != STATUS_CANARY => {
                bad.push(("status".into(), "none (consumed)".into(), ExpectStatus::name(got)))
            }
            _ => {}
        }
    }
    let mut stream = Vec::new();
    for &(a, l) in &writable {
        let mut b = vec![0u8; l];
        q.mem().read(a, &mut b);
        stream.extend_from_slice(&b);
    }
    let want_dst = r
        .expect
        .dst
        .as_deref()
        .map(unhex)
        .transpose()
        .map_err(Error::Raw)?;
    if let Some(want) = &want_dst {
        if stream.get(..want.len()) != Some(&want[..]) {
            bad.push((
                "dst".into(),
                hex(want),
                hex(&stream[..want.len().min(stream.len())]),
            ));
        }
    }
    if r.expect.untouched {
        // Every writable scratch byte past the expected output, except the
        // status byte (the stream's last byte when a scratch descriptor is
        // the chain's last writable one), keeps the canary.
        let from = want_dst.as_ref().map_or(0, Vec::len);
        let skip = status_at.map(|_| stream.len().saturating_sub(1));
        let touched = stream
            .iter()
            .enumerate()
            .skip(from)
            .any(|(i, &b)| Some(i) != skip && b != DST_CANARY);
        if touched {
            bad.push((
                "writable buffers".into(),
                "untouched past the output".into(),
                "written".into(),
            ));
        }
    }
    // The device may write only inside the writable scratch buffers: the
    // readable ones (data it was given), the bytes between buffers and
    // those after the status byte must be as this tool put them.
    let in_writable = |a: u64| writable.iter().any(|&(w, l)| a >= w && a < w + l as u64);
    let outside = q
        .mem()
        .view(base, scratch)
        .iter()
        .zip(&put)
        .enumerate()
        .find(|&(i, (now, was))| now != was && !in_writable(base + i as u64));
    if let Some((i, (&now, &was))) = outside {
        bad.push((
            format!("scratch byte {i} (in no writable buffer)"),
            format!("{was:02x}"),
            format!("{now:02x}"),
        ));
    }
    Ok(RawOutcome {
        mismatches: bad,
        status: seen,
    })
}
