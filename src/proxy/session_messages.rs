// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crypto session messages, answered by this layer:
//! `CREATE_CRYPTO_SESSION` and `CLOSE_CRYPTO_SESSION`
//! (`docs/PROTOCOL.md` §2, §3).

use log::warn;
use zeroize::Zeroizing;

use crate::sessions::{wipe_stack, SessionRegistry, CREATE_STACK_WIPE_BYTES};
use crate::wire::session::{create_reply, decode_close, decode_create, SessionAbi};
use crate::wire::virtio_crypto::Status;

use super::AbiChoice;

/// Decodes a CREATE payload, runs it through the registry and builds the
/// reply message (zeroized when dropped, see [`create_reply`]). Never
/// fails: a payload that matches no layout, or not the forced one, gets a
/// negative session id in a reply of the same size.
///
/// The stack below the caller is wiped before returning
/// ([`crate::sessions::wipe_stack`]): decoding the payload and expanding
/// the keys leave copies of them there.
pub fn handle_create(registry: &mut SessionRegistry, payload: &[u8], abi: AbiChoice) -> Zeroizing<Vec<u8>> {
    let reply = create_session(registry, payload, abi);
    wipe_stack::<CREATE_STACK_WIPE_BYTES>();
    reply
}

/// [`handle_create`] without the stack wipe, out of line so that all of
/// its key handling runs in frames below the wiping one.
#[inline(never)]
fn create_session(registry: &mut SessionRegistry, payload: &[u8], abi: AbiChoice) -> Zeroizing<Vec<u8>> {
    let layout = match abi {
        AbiChoice::Auto => SessionAbi::detect(payload),
        AbiChoice::Fixed(a) => Some(a),
    };
    let id = match layout.map(|l| (l, decode_create(payload, l))) {
        Some((_, Ok(info))) => registry.create(&info),
        Some((_, Err(e))) => {
            warn!("CREATE_CRYPTO_SESSION refused: {e}");
            crate::stats::daemon().sessions.create_failed();
            -(Status::Err as i64)
        }
        None => {
            warn!(
                "CREATE_CRYPTO_SESSION refused: payload of {} bytes matches no layout",
                payload.len()
            );
            crate::stats::daemon().sessions.create_failed();
            -(Status::Err as i64)
        }
    };
    // The id goes where the frontend that sent this size reads it: at 1064
    // in a 1072-byte payload, at 0 otherwise (also when a forced layout
    // does not match the size).
    create_reply(payload, SessionAbi::detect(payload), id)
}

/// Handles a CLOSE payload (the u64 session id): closes the session and
/// returns whether it was live. An unknown id, or a payload that is not 8
/// bytes, is ignored (logged), never an error: QEMU reads no reply and a
/// guest can name any id in its destroy request.
pub fn handle_close(registry: &mut SessionRegistry, payload: &[u8]) -> bool {
    match decode_close(payload) {
        Ok(id) => registry.close(id),
        Err(e) => {
            warn!("CLOSE_CRYPTO_SESSION ignored: {e}");
            false
        }
    }
}
