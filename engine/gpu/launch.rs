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

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError,
    LaunchConfig, sys,
};

/// A kernel argument as the 8 bytes the driver copies it from: a device buffer's address,
/// or a scalar (a 4-byte one in the low half, which is what the driver reads for it).
pub trait KernelArg {
    fn slot(&self, stream: &CudaStream) -> u64;
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
    slots: Vec<u64>,
}

impl<'a> Launch<'a> {
    pub fn new(stream: &'a CudaStream, func: &'a CudaFunction, overlap: bool) -> Launch<'a> {
        Launch {
            stream,
            func,
            overlap,
            #[cfg(feature = "probes")]
            cooperative: false,
            slots: Vec::with_capacity(16),
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
        self.slots.push(a.slot(self.stream));
        self
    }

    /// An optional buffer argument (a bias): its address, or a null pointer for none.
    pub fn arg_or_null(&mut self, a: Option<&impl KernelArg>) -> &mut Self {
        self.slots.push(a.map_or(0, |a| a.slot(self.stream)));
        self
    }

    /// Submits the launch to the stream.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters in number, order and type, and `cfg`
    /// meets the kernel's preconditions; the buffers outlive the kernel's run.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params: Vec<*mut c_void> = self
            .slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
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
        // SAFETY: the caller's guarantee for the kernel; `params` points at one slot per
        // argument, alive until the call returns (the driver copies them).
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
