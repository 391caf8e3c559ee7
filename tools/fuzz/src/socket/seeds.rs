// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `socket` target's seed corpus.

use vhost_user_crypto::wire::vhost_user::FrontendReq;

use super::{Attach, Body, FileKind, FileSpec, Op, Region, SocketProgram};

/// The seed corpus: valid messages as QEMU sends them, and the refusals
/// of the framing and of the checks.
pub fn seeds() -> Vec<(&'static str, SocketProgram)> {
    let memfd = |len| FileSpec {
        kind: FileKind::Sealable,
        len,
    };
    let file = |kind, len| FileSpec { kind, len };
    let one = |first| Attach { count: 1, first };
    let msg = |request: FrontendReq, flags, body, fds| Op::Msg {
        request: u32::from(request),
        flags,
        size: None,
        body,
        fds,
        split: 0,
        fds_late: false,
    };
    let u64m = |request, v| msg(request, 1, Body::U64(v), Attach::default());
    let empty = |request| {
        msg(
            request,
            1,
            Body::Bytes {
                len: 0,
                fill: 0,
                patch: Vec::new(),
            },
            Attach::default(),
        )
    };
    let region = |gpa, size, offset| Region {
        gpa,
        size,
        uaddr: 0x7f00_0000_0000 + gpa,
        offset,
    };
    let table = |regions: Vec<Region>| Body::MemTable {
        count: regions.len() as u32,
        regions,
        cut: 0,
    };
    let state = |index: u32, num: u32| {
        let mut p = index.to_le_bytes().to_vec();
        p.extend_from_slice(&num.to_le_bytes());
        Body::Bytes {
            len: 8,
            fill: 0,
            patch: p,
        }
    };
    let p = |require_sealed, files, ops| SocketProgram {
        require_sealed,
        files,
        ops,
    };
    // QEMU's start-up of a one-queue device (hw/virtio/vhost-user.c):
    // features, owner, memory table, rings, a CREATE.
    let handshake = vec![
        empty(FrontendReq::GET_FEATURES),
        u64m(FrontendReq::SET_FEATURES, 0x1_4000_0000),
        empty(FrontendReq::GET_PROTOCOL_FEATURES),
        u64m(FrontendReq::SET_PROTOCOL_FEATURES, 0x89),
        empty(FrontendReq::SET_OWNER),
        msg(
            FrontendReq::SET_MEM_TABLE,
            1,
            table(vec![region(0, 1 << 20, 0)]),
            one(0),
        ),
        msg(FrontendReq::SET_VRING_NUM, 1, state(1, 256), Attach::default()),
        msg(
            FrontendReq::SET_VRING_ADDR,
            1,
            Body::Bytes {
                len: 40,
                fill: 0,
                patch: vec![1, 0, 0, 0, 0, 0, 0, 0],
            },
            Attach::default(),
        ),
        msg(FrontendReq::SET_VRING_BASE, 1, state(1, 0), Attach::default()),
        msg(FrontendReq::SET_VRING_KICK, 1, Body::U64(1), one(1)),
        msg(FrontendReq::SET_VRING_CALL, 1, Body::U64(1), one(1)),
        u64m(FrontendReq::SET_VRING_KICK, 0x101),
        msg(
            FrontendReq::CREATE_CRYPTO_SESSION,
            1,
            Body::Bytes {
                len: 1072,
                fill: 0,
                patch: vec![0, 0, 0, 0, 1],
            },
            Attach::default(),
        ),
        u64m(FrontendReq::CLOSE_CRYPTO_SESSION, 1),
    ];
    let efd = file(FileKind::EventFd, 0);
    let mut v = vec![(
        "qemu-handshake",
        p(false, vec![memfd(1 << 20), efd], handshake.clone()),
    )];
    // The same, each message cut in two sendmsg calls, the descriptors
    // with the second part.
    let cut: Vec<Op> = handshake
        .iter()
        .cloned()
        .map(|mut o| {
            if let Op::Msg { split, fds_late, .. } = &mut o {
                *split = 7;
                *fds_late = true;
            }
            o
        })
        .collect();
    v.push(("qemu-handshake-split", p(true, vec![memfd(1 << 20), efd], cut)));
    // Two regions, then ADD_MEM_REG (CONFIGURE_MEM_SLOTS), from a memfd
    // sealed as QEMU seals it and one that cannot be sealed.
    v.push((
        "two-regions-and-add",
        p(
            false,
            vec![
                file(FileKind::Sealed, 2 << 20),
                file(FileKind::Unsealable, 1 << 20),
            ],
            vec![
                msg(
                    FrontendReq::SET_MEM_TABLE,
                    1,
                    table(vec![region(0, 2 << 20, 0), region(2 << 20, 1 << 20, 0)]),
                    Attach { count: 2, first: 0 },
                ),
                msg(
                    FrontendReq::ADD_MEM_REG,
                    1,
                    Body::MemReg {
                        pad: 0,
                        region: region(4 << 20, 4096, (1 << 20) - 4096),
                        cut: 0,
                    },
                    one(1),
                ),
            ],
        ),
    ));
    // Refusals: a region past its file's end, an offset that overflows,
    // an eventfd as memory, an unsealable file with --require-sealed-memory,
    // a count that does not match the descriptors.
    let past = |size, offset| {
        p(
            false,
            vec![memfd(1 << 20)],
            vec![msg(
                FrontendReq::SET_MEM_TABLE,
                1,
                table(vec![region(0, size, offset)]),
                one(0),
            )],
        )
    };
    v.push(("region-past-file-end", past(2 << 20, 0)));
    v.push(("region-offset-overflows", past(4096, u64::MAX - 100)));
    v.push((
        "eventfd-as-memory",
        p(
            false,
            vec![efd],
            vec![msg(
                FrontendReq::SET_MEM_TABLE,
                1,
                table(vec![region(0, 4096, 0)]),
                one(0),
            )],
        ),
    ));
    v.push((
        "unsealable-with-require-sealed",
        p(
            true,
            vec![file(FileKind::Unsealable, 1 << 20)],
            vec![msg(
                FrontendReq::SET_MEM_TABLE,
                1,
                table(vec![region(0, 1 << 20, 0)]),
                one(0),
            )],
        ),
    ));
    v.push((
        "count-mismatch",
        p(
            false,
            vec![memfd(1 << 20)],
            vec![msg(
                FrontendReq::SET_MEM_TABLE,
                1,
                Body::MemTable {
                    count: 2,
                    regions: vec![region(0, 4096, 0), region(4096, 4096, 4096)],
                    cut: 0,
                },
                one(0),
            )],
        ),
    ));
    // Framing: a size over 4096, 33 descriptors, a truncated header and a
    // truncated payload.
    v.push((
        "size-over-limit",
        p(
            false,
            Vec::new(),
            vec![Op::Msg {
                request: u32::from(FrontendReq::GET_FEATURES),
                flags: 1,
                size: Some(4097),
                body: Body::U64(0),
                fds: Attach::default(),
                split: 0,
                fds_late: false,
            }],
        ),
    ));
    v.push((
        "33-descriptors",
        p(
            false,
            vec![efd, efd],
            vec![msg(
                FrontendReq::SET_VRING_CALL,
                1,
                Body::U64(0),
                Attach { count: 33, first: 0 },
            )],
        ),
    ));
    v.push((
        "truncated-header",
        p(
            false,
            Vec::new(),
            vec![
                empty(FrontendReq::GET_FEATURES),
                Op::Raw {
                    bytes: vec![1, 0, 0, 0, 1, 0],
                    fds: Attach::default(),
                },
            ],
        ),
    ));
    v.push((
        "truncated-payload",
        p(
            false,
            Vec::new(),
            vec![Op::Msg {
                request: u32::from(FrontendReq::SET_FEATURES),
                flags: 1,
                size: Some(16),
                body: Body::U64(0),
                fds: Attach::default(),
                split: 0,
                fds_late: false,
            }],
        ),
    ));
    v
}
