// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Facts of the split virtqueue both of its sides use (VIRTIO 1.2 §2.7).
//! The ring layout itself is the device's (`crate::virtq`, with the
//! `backend` feature) and the driver's (the replay tool's `driver_ring`)
//! own code; descriptor flags come from `virtio-bindings`.

/// Largest queue size a split ring may have: "Queue Size value is always
/// a power of 2. The maximum Queue Size value is 32768" (VIRTIO 1.2 §2.7).
pub const MAX_QUEUE_SIZE: u16 = 32768;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_queue_size_is_the_spec_value() {
        assert_eq!(MAX_QUEUE_SIZE, 32768);
        assert!(MAX_QUEUE_SIZE.is_power_of_two());
    }
}
