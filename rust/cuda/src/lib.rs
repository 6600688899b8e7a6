//! Uploads to NVIDIA GPUs through the CUDA driver API, loaded at run time with `cudarc`: no CUDA
//! toolkit to build, and a clean [`Error::Cuda`] (never a panic) on machines without a driver or
//! a device.
//!
//! [`Uploader`] runs `safetensors_core`'s staged pipeline ([`Ring`]) with pinned staging buffers
//! (page-locked, not write-combined: readers write them and the copy engine reads them), a
//! blocking-sync event per buffer (a waiting reader sleeps instead of spinning on a core the
//! other readers need), and asynchronous host-to-device copies on a non-blocking stream. By
//! default only the staging ring is page-locked; with [`ZeroCopy`] on, spans of a mapped file
//! are registered with the driver a bounded window at a time and copied straight from the page
//! cache, beside the staging readers (locking a whole file at once, and copying pageable
//! memory, were both measured slow).
//!
//! Contexts, as the CUDA runtime handles them: each device's primary context is retained once,
//! the first time the library uses the device, and kept for the life of the process, so device
//! memory handed to a caller outlives every `Uploader` (releasing the last reference would reset
//! the context and free it). Every entry point makes the context current only for its own
//! duration ([`Current`]) and restores the caller's, on the caller's thread and on each reader
//! thread.
//!
//! The layers, each importing only those above it:
//! - `numa.rs`: the NUMA node a GPU hangs off, where its readers run and its pinned memory
//!   is allocated;
//! - `driver.rs`: the driver library, devices, primary contexts, [`Current`];
//! - `memory.rs`: device allocations, streams, the event pool;
//! - `pool.rs`: pinned memory, and each device's idle list of it, reused across uploads;
//! - `pinned.rs`: pinned staging slots and the ring's target on a device;
//! - `register.rs`: zero-copy spans straight from a mapped file's pages (registered with the
//!   driver, read-only, a bounded window at a time), beside the staging readers;
//! - `trace.rs`: the device's side of an upload's timeline (timing events, trace mode only);
//! - `uploader.rs`: [`Uploader`], whole uploads through the ring;
//! - `landing.rs`: streaming uploads (each tensor handed to the caller as it lands, or through
//!   a bounded device scratch ring); `stage.rs`: one rank's staging for multi-rank loads;
//! - `save.rs`: saving device memory, through a small pinned ring, into a writer.

mod driver;
mod landing;
mod memory;
mod numa;
mod pinned;
mod pool;
mod register;
mod save;
mod stage;
mod trace;
mod uploader;

pub use driver::{device_count, Current, Gpu, BUILT, NOT_BUILT};
pub use landing::{Delivery, LandedTensor};
pub use memory::{free, DeviceBuffer};
pub use numa::Node;
pub use pinned::PinnedSlot;
pub use pool::{release_idle, IDLE_BYTES, IDLE_SLOTS};
pub use register::{FeedStats, ZeroCopy};
pub use save::{save_from_device, DeviceSource};
pub use stage::Stager;
pub use uploader::Uploader;

#[cfg(test)]
mod tests {
    use safetensors_core::upload::RingOptions;

    use super::*;

    /// On machines without an NVIDIA driver (CI), every entry point gives a `Cuda` error that
    /// says so, instead of panicking.
    #[test]
    fn no_driver_is_a_clean_cuda_error() {
        match device_count() {
            Ok(n) => eprintln!("SKIPPED: a CUDA driver is present here ({n} devices)"),
            Err(e) => {
                assert_eq!(e.kind(), safetensors_core::ErrorKind::Cuda);
                let text = e.to_string();
                assert!(
                    text.contains("libcuda") || text.contains("no CUDA device"),
                    "{text}"
                );
                assert_eq!(
                    Gpu::open(0).err().map(|e| e.kind()),
                    Some(safetensors_core::ErrorKind::Cuda)
                );
                assert_eq!(
                    Uploader::new(0, RingOptions::default())
                        .err()
                        .map(|e| e.kind()),
                    Some(safetensors_core::ErrorKind::Cuda)
                );
            }
        }
    }
}
