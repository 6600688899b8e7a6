//! The driver and its contexts: loading `libcuda` at run time ([`call`] turns every failure,
//! panics of a missing library included, into `Error::Cuda`), device ordinals, each device's
//! primary context (retained once, for the life of the process) and [`Current`], which makes it
//! current only for the duration of one of our calls and restores the caller's.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use safetensors_core::{Error, Result};

/// Runs a driver call, turning its error, and the panic `cudarc` raises for a missing driver
/// library or symbol, into `Error::Cuda` naming what was being done.
pub(crate) fn call<T>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        // The enum's own name (e.g. CUDA_ERROR_NO_DEVICE): DriverError's Debug asks the driver
        // for a description, which must not be relied on when the driver is the problem.
        Ok(Err(e)) => Err(Error::Cuda {
            message: format!("{what} failed: {:?}", e.0),
        }),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::Cuda {
                message: format!("{what}: the CUDA driver library is unusable: {why}"),
            })
        }
    }
}

/// Whether this build uploads to GPUs (the `driver` feature; CMake's `SAFETENSORS_CUDA`). A
/// build without it never loads the driver library: every entry point reaches [`driver`]
/// first (through [`device_count`] or [`Gpu::open`]) and gets [`NOT_BUILT`].
pub const BUILT: bool = cfg!(feature = "driver");

/// What every CUDA entry point of a build without CUDA answers (an `Error::Cuda`).
pub const NOT_BUILT: &str =
    "this build of the safetensors library has no CUDA support (configure with -DSAFETENSORS_CUDA=ON)";

/// Loads the driver library and initialises it, once. The library is probed first because
/// `cudarc` panics when it is missing. In a build without CUDA: [`NOT_BUILT`], nothing loaded.
fn driver() -> Result<()> {
    if !BUILT {
        return Err(Error::Cuda {
            message: NOT_BUILT.into(),
        });
    }
    static INIT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver is \
                        installed, or it is not on the library path"
                    .into(),
            );
        }
        call("cuInit", cu::init).map_err(|e| match e {
            Error::Cuda { message } if message.contains("CUDA_ERROR_NO_DEVICE") => {
                "no CUDA device: the driver is installed but sees no GPU".to_string()
            }
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(|message| Error::Cuda { message })
}

/// The NUMA node of device `ordinal` (see [`crate::numa`]), looked up once per device.
pub(crate) fn node_of(ordinal: usize) -> Option<crate::numa::Node> {
    crate::numa::gpu_node(ordinal, || {
        let device = call("cuDeviceGet", || cu::device::get(ordinal as i32)).ok()?;
        let attr = |a| {
            // SAFETY: a device handle the driver returned.
            call("cuDeviceGetAttribute", || unsafe {
                cu::device::get_attribute(device, a)
            })
            .ok()
        };
        use sys::CUdevice_attribute as A;
        Some((
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        ))
    })
}

/// Number of CUDA devices (an error when there is no driver).
pub fn device_count() -> Result<usize> {
    driver()?;
    call("cuDeviceGetCount", cu::device::get_count).map(|n| n.max(0) as usize)
}

/// A context made current on this thread for the guard's life; the thread's previous context
/// (none included) comes back on drop, so a caller's later allocations and kernels land where
/// they did before calling us.
pub struct Current {
    previous: Option<sys::CUcontext>,
    changed: bool,
}

impl Current {
    pub(crate) fn enter(ctx: sys::CUcontext) -> Result<Current> {
        let previous = call("cuCtxGetCurrent", cu::ctx::get_current)?;
        if previous == Some(ctx) {
            return Ok(Current {
                previous,
                changed: false,
            });
        }
        // SAFETY: `ctx` is a primary context retained for the life of the process.
        call("cuCtxSetCurrent", || unsafe { cu::ctx::set_current(ctx) })?;
        Ok(Current {
            previous,
            changed: true,
        })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.changed {
            let previous = self.previous.unwrap_or(std::ptr::null_mut());
            // SAFETY: the caller's own context (or none), as it was when we were entered.
            let _ = call("cuCtxSetCurrent", || unsafe {
                cu::ctx::set_current(previous)
            });
        }
    }
}

/// The primary context of each device, retained once and never released (see the crate
/// documentation). Stored as addresses: the handles are plain pointers valid on any thread.
fn primary_context(ordinal: usize, device: sys::CUdevice) -> Result<sys::CUcontext> {
    static RETAINED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut retained = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, ctx)) = retained.iter().find(|(o, _)| *o == ordinal) {
        return Ok(ctx as sys::CUcontext);
    }
    // SAFETY: `device` came from cuDeviceGet.
    let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
        cu::primary_ctx::retain(device)
    })?;
    retained.push((ordinal, ctx as usize));
    Ok(ctx)
}

/// One device and its primary context (retained for the life of the process).
pub struct Gpu {
    ordinal: usize,
    device: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
    /// The NUMA node the device hangs off, where there is one to place work on.
    node: Option<crate::numa::Node>,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Device `ordinal`, or `Error::Cuda` saying why not.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Cuda {
                message: format!("no CUDA device {ordinal}: this machine has {count}"),
            });
        }
        let device = call("cuDeviceGet", || cu::device::get(ordinal as i32))?;
        let ctx = primary_context(ordinal, device)?;
        Ok(Arc::new(Gpu {
            ordinal,
            device,
            ctx,
            node: node_of(ordinal),
        }))
    }

    /// The NUMA node the device hangs off, with the CPUs of it this process may use; `None` on
    /// a machine with one node, where the kernel does not know it, or with `SAFETENSORS_NUMA=0`.
    /// Reader threads run there and pinned staging is allocated from its memory.
    pub fn numa_node(&self) -> Option<&crate::numa::Node> {
        self.node.as_ref()
    }

    /// Makes this device's context current on the calling thread until the guard drops.
    pub fn enter(&self) -> Result<Current> {
        Current::enter(self.ctx)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// A device attribute.
    pub(crate) fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: a device handle the driver returned.
        call("cuDeviceGetAttribute", || unsafe {
            cu::device::get_attribute(self.device, a)
        })
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Result<String> {
        call("cuDeviceGetName", || cu::device::get_name(self.device))
    }

    /// Copies `dst.len()` bytes from device address `src` to host memory (synchronous).
    pub fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let _current = self.enter()?;
        // SAFETY: the caller names device memory of at least `dst.len()` bytes.
        call("cuMemcpyDtoH", || unsafe { cu::memcpy_dtoh_sync(dst, src) })
    }

    /// Checks that `stream` may carry this device's copies: not the per-thread default stream
    /// (our copies are issued from reader threads, each of which has its own), in this
    /// device's context, and not capturing a graph (a captured copy would run at graph launch,
    /// long after the staging buffer was reused).
    pub(crate) fn check_stream(&self, stream: u64) -> Result<()> {
        // 0 and CU_STREAM_LEGACY (1) are the legacy default stream of the current context,
        // which readers make ours.
        if stream == 0 || stream == 1 {
            return Ok(());
        }
        if stream == 2 {
            return Err(Error::Cuda {
                message: "the per-thread default stream (cudaStreamPerThread, 0x2) cannot carry \
                          an upload: its copies are issued from the library's reader threads, \
                          each of which has its own per-thread stream. Pass a stream you created, \
                          or 0 for the legacy default stream"
                    .into(),
            });
        }
        let handle = stream as sys::CUstream;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller passes a stream handle; the driver validates it.
        call("cuStreamGetCtx", || unsafe {
            sys::cuStreamGetCtx(handle, &mut ctx).result()
        })
        .map_err(|e| Error::Cuda {
            message: format!("{e}: {stream:#x} is not a valid CUDA stream"),
        })?;
        if ctx != self.ctx {
            return Err(Error::Cuda {
                message: format!(
                    "stream {stream:#x} belongs to another context than CUDA device {}'s primary \
                     context (another device, or a context created with cuCtxCreate): upload on \
                     a stream of device {}",
                    self.ordinal, self.ordinal
                ),
            });
        }
        // SAFETY: a valid stream, checked above.
        let status = call("cuStreamIsCapturing", || unsafe {
            cu::stream::is_capturing(handle)
        })?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::Cuda {
                message: format!(
                    "stream {stream:#x} is capturing a CUDA graph: an upload cannot be captured \
                     (its staging buffers are reused as soon as each copy has run); end the \
                     capture first"
                ),
            });
        }
        Ok(())
    }

    /// Checks that `[dst, dst + capacity)` is device memory of this device, in one allocation.
    pub(crate) fn check_destination(&self, dst: u64, capacity: usize) -> Result<()> {
        let what = format!("the destination {dst:#x}");
        self.check_range(
            &what,
            "this uploader writes to",
            dst,
            capacity,
            "bytes of capacity given",
        )
    }

    /// Checks that `[src, src + len)` is device memory of this device, in one allocation: the
    /// bytes of tensor `tensor` to save.
    pub(crate) fn check_source(&self, tensor: &str, src: u64, len: usize) -> Result<()> {
        self.check_range(
            &format!("the bytes of tensor `{tensor}` at {src:#x}"),
            "these tensors are saved from",
            src,
            len,
            "bytes of the tensor",
        )
    }

    /// Checks that `[ptr, ptr + len)` (`what`, for messages) is device memory of this device
    /// (`role` says what the device is to the call; `bytes` what `len` counts), in one
    /// allocation.
    fn check_range(&self, what: &str, role: &str, ptr: u64, len: usize, bytes: &str) -> Result<()> {
        let attribute = |name: &str, attr: sys::CUpointer_attribute| -> Result<u64> {
            let mut value = 0u64;
            // SAFETY: every attribute read here fits in 8 bytes (an int is read into the low
            // bytes on little-endian hosts, the only ones CUDA supports).
            call(name, || unsafe {
                sys::cuPointerGetAttribute(
                    &mut value as *mut u64 as *mut c_void,
                    attr,
                    ptr as sys::CUdeviceptr,
                )
                .result()
            })
            .map_err(|e| Error::Cuda {
                message: format!("{e}: {what} is not device memory this driver knows"),
            })?;
            Ok(value)
        };
        use sys::CUpointer_attribute as A;
        let ordinal = attribute(
            "cuPointerGetAttribute(DEVICE_ORDINAL)",
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        )? as u32 as usize;
        if ordinal != self.ordinal {
            return Err(Error::Cuda {
                message: format!(
                    "{what} is memory of CUDA device {ordinal}, not of device {} that {role}",
                    self.ordinal
                ),
            });
        }
        let start = attribute(
            "cuPointerGetAttribute(RANGE_START_ADDR)",
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        )?;
        let size = attribute(
            "cuPointerGetAttribute(RANGE_SIZE)",
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        )?;
        // Compared as what is left, never as `ptr - start + len`: a caller's length near 2^64
        // (SIZE_MAX for "unknown") would wrap that sum into "fits".
        let left = size.saturating_sub(ptr.saturating_sub(start));
        if len as u64 > left {
            return Err(Error::Cuda {
                message: format!(
                    "{what} has {left} bytes left in its allocation, not the {len} {bytes}"
                ),
            });
        }
        Ok(())
    }
}
