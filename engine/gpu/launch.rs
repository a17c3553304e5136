//! Kernel launches through the driver's `cuLaunchKernelEx`, which takes launch attributes
//! (cudarc's launch builder does not pass any). The one used here is programmatic dependent
//! launch (Hopper and later): the launch may place a kernel's blocks on the GPU while the
//! kernel before it drains. Every rustle kernel's first line waits for that kernel
//! (`wait_for_previous_kernel` in `gpu-kernels/src/device.rs`), so what each computes is
//! unchanged; what goes away is the gap between one kernel's last block and the next one's
//! first, paid hundreds of times per decode step. The other attribute used, in `--features
//! probes` builds only, is the cooperative launch, for the measurement experiments whose
//! blocks wait for each other (`read_phases_u32`, `read_phases_staged_u32`).
//!
//! The builder has the shape of cudarc's: `.arg(&x)` per kernel argument, in order, then
//! `launch(cfg)`.

use std::ffi::c_void;

use crate::kernel_args::ByValue;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError,
    LaunchConfig, sys,
};

/// A kernel argument as the 8 bytes the driver copies it from: a device buffer's address,
/// or a scalar (a 4-byte one in the low half, which is what the driver reads for it). A
/// struct passed by value (`ByValue`) takes as many 8-byte words as its bytes need.
pub trait KernelArg {
    fn slot(&self, stream: &CudaStream) -> u64;

    /// Appends the argument's words to `words`.
    fn push(&self, stream: &CudaStream, words: &mut Vec<u64>) {
        words.push(self.slot(stream));
    }
}

/// A `#[repr(C)]` struct of sizes (`kernel_args`), copied word by word.
impl<T: ByValue> KernelArg for T {
    fn slot(&self, _: &CudaStream) -> u64 {
        unreachable!("a struct argument is pushed whole")
    }

    fn push(&self, _: &CudaStream, words: &mut Vec<u64>) {
        let n = size_of::<T>().div_ceil(8);
        let first = words.len();
        words.resize(first + n, 0);
        // SAFETY: `T` is plain data (`ByValue`); the n words just added hold its bytes, and
        // a word's alignment (8) is at least a `u32`'s, all these structs hold.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self as *const T as *const u8,
                words[first..].as_mut_ptr() as *mut u8,
                size_of::<T>(),
            )
        };
    }
}

impl<T> KernelArg for CudaSlice<T> {
    fn slot(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl<T> KernelArg for CudaView<'_, T> {
    fn slot(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl<T> KernelArg for CudaViewMut<'_, T> {
    fn slot(&self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl KernelArg for u32 {
    fn slot(&self, _: &CudaStream) -> u64 {
        *self as u64
    }
}

impl KernelArg for f32 {
    fn slot(&self, _: &CudaStream) -> u64 {
        self.to_bits() as u64
    }
}

/// A null pointer or a 64-bit scalar.
impl KernelArg for u64 {
    fn slot(&self, _: &CudaStream) -> u64 {
        *self
    }
}

/// One launch being assembled.
pub struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    /// Allow the launch to overlap the previous kernel (programmatic dependent launch).
    overlap: bool,
    /// Have the driver place every block at once, or refuse the launch (`cooperative`).
    #[cfg(feature = "probes")]
    cooperative: bool,
    /// The arguments' words, and where each argument's first one is.
    words: Vec<u64>,
    starts: Vec<usize>,
}

impl<'a> Launch<'a> {
    pub fn new(stream: &'a CudaStream, func: &'a CudaFunction, overlap: bool) -> Launch<'a> {
        Launch {
            stream,
            func,
            overlap,
            #[cfg(feature = "probes")]
            cooperative: false,
            words: Vec::with_capacity(16),
            starts: Vec::with_capacity(16),
        }
    }

    /// A cooperative launch: the driver places all of the grid's blocks on the GPU at once
    /// or refuses the launch, so that blocks may wait for each other (`grid_barrier`), and
    /// the launch does not overlap the kernel before it.
    #[cfg(feature = "probes")]
    pub fn cooperative(&mut self) -> &mut Self {
        self.cooperative = true;
        self.overlap = false;
        self
    }

    /// The next kernel argument.
    pub fn arg(&mut self, a: &impl KernelArg) -> &mut Self {
        self.starts.push(self.words.len());
        a.push(self.stream, &mut self.words);
        self
    }

    /// An optional buffer argument (a bias): its address, or a null pointer for none.
    pub fn arg_or_null(&mut self, a: Option<&impl KernelArg>) -> &mut Self {
        self.starts.push(self.words.len());
        self.words.push(a.map_or(0, |a| a.slot(self.stream)));
        self
    }

    /// Submits the launch to the stream.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters in number, order and type, and `cfg`
    /// meets the kernel's preconditions; the buffers outlive the kernel's run.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let base = self.words.as_mut_ptr();
        // SAFETY: every start is inside `words`, which no longer grows.
        let mut params: Vec<*mut c_void> = self
            .starts
            .iter()
            .map(|&i| unsafe { base.add(i) } as *mut c_void)
            .collect();
        // SAFETY: a plain C struct; zero is a valid bit pattern for it.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if self.overlap {
                &mut attr
            } else {
                std::ptr::null_mut()
            },
            numAttrs: self.overlap as u32,
        };
        // A cooperative launch passes its own attribute instead (it never overlaps).
        // SAFETY: as `attr`.
        #[cfg(feature = "probes")]
        let mut together: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        #[cfg(feature = "probes")]
        let config = if self.cooperative {
            together.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            together.value.cooperative = 1;
            sys::CUlaunchConfig {
                attrs: &mut together,
                numAttrs: 1,
                ..config
            }
        } else {
            config
        };
        // SAFETY: the caller's guarantee for the kernel; `params` points at each argument's
        // words, alive until the call returns (the driver copies them).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }
}
