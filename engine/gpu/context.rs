//! Opening the GPU: the driver, the device, one stream, the kernels.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr,
    DriverError, ValidAsZeroBits, sys,
};
use cudarc::nvrtc::Ptx;

use super::kernels::table::{GemmSlots, Kernels};
use super::tensor_maps::{MapKey, TensorMaps};
use super::tuned_plans::TunedPlans;
use crate::error::{Error, Result};
use crate::tiles::{QUANT_MAX_TOKENS, STREAM_BLOCK_BYTES, STREAM_MIN_ROWS, STREAM_ONE_BLOCK_BYTES};
use crate::weights::blocks::BlockType;

/// Cloning shares the context, stream and module.
#[derive(Clone)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// Everything runs on this one stream, in order.
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    /// "NVIDIA H200 (sm_90, 139.8 GiB)"
    pub description: String,
    /// Streaming multiprocessors: how many blocks run at once, times what fits on one.
    pub sm_count: usize,
    /// Blocks of each tensor-core GEMM that run at once.
    pub gemm_slots: GemmSlots,
    /// Launch kernels with programmatic dependent launch (sm_90 and later): each may be
    /// placed on the GPU while the one before it drains; it waits for it on its first line
    /// (an instruction that does nothing when the launch did not ask for it).
    pub pdl: bool,
    /// The decode step's gate and up GEMV over GGUF blocks streams its weights through
    /// shared memory (`gemv_swiglu_stream_<type>`, sm_90a) where the build has the kernels
    /// and the rows allow it; RUSTLE_GEMV_STREAM=0 keeps `gemv_swiglu_<type>`, to measure
    /// what it brings.
    pub gemv_stream: bool,
    /// The streamed GEMV's shared memory a block (its stages), in bytes:
    /// `STREAM_BLOCK_BYTES`, or RUSTLE_STREAM_BYTES to measure others.
    pub stream_bytes: usize,
    /// The same for the GEMVs of one matrix that stream (`gemv_stream_<type>`):
    /// `STREAM_ONE_BLOCK_BYTES`, or RUSTLE_STREAM_ONE_BYTES.
    pub stream_one_bytes: usize,
    /// The fewest rows of a matrix whose GEMV of one matrix streams, where
    /// `gemv_stream` is on: `STREAM_MIN_ROWS`, or RUSTLE_STREAM_MIN_ROWS (a large value keeps
    /// every such GEMV on `gemv_<type>`, to measure what streaming brings).
    pub stream_min_rows: usize,
    /// Most tokens of a decode step a matmul over GGUF blocks takes through the integer
    /// GEMV, past which `gemm_<type>` takes them, where RUSTLE_GEMV_TOKENS (1 to
    /// `QUANT_MAX_TOKENS`) sets it to measure others: else `decode_gemv_tokens` decides.
    pub gemv_tokens_knob: Option<usize>,
    /// The fewest tokens the integer GEMV takes on the tensor cores (`gemv_mma_<type>`):
    /// `MMA_GEMV_MIN_TOKENS`, or RUSTLE_GEMV_MMA_TOKENS (`QUANT_MAX_TOKENS + 1`: none).
    pub gemv_mma_tokens: usize,
    /// Measure the warpgroup GEMM's plans when a model loads (`gemm_tuning`), or keep the
    /// estimates: RUSTLE_GEMM_TUNE (default on).
    pub gemm_tune: bool,
    /// A hash of the PTX loaded: plans measured with other kernels are not this build's.
    pub kernels_hash: u64,
    /// The warpgroup GEMM's plans measured on this GPU (`tuned_plans`), shared by all clones:
    /// every plan of `gemm_wgmma_bf16` and `gemm_wgmma_fp8` is looked up here.
    pub tuned_plans: Arc<RwLock<TunedPlans>>,
    /// While profiling: every launch with events around it, and the positions of the batch
    /// being run (shared by all clones).
    profile: Arc<Mutex<Option<Profiling>>>,
    /// The tensor maps made so far (`tensor_maps`), shared by all clones.
    tensor_maps: Arc<Mutex<TensorMaps>>,
}

/// Most tokens of a decode step a matmul over GGUF blocks takes through the integer GEMV
/// (`gemv_<type>`, whose weights are decoded again for each token), past which
/// `gemm_<type>` (the tensor cores, eight tokens a product whatever their number) costs
/// less. On the H200 (Llama 3 8B's shape, `rustle bench --batch 2,4,8`;
/// docs/lessons.md#batched-decode-and-the-gemm), tok/s at 2, 4 and 8 sequences with the GEMV up to 8 tokens / 2 / 1: Q4_K_M
/// 506.3, 565.7, 622.9 / 510.1, 697.1, 1342.9 / 353.7, 698.5, 1337.4; Q8_0 447.1, 497.0,
/// 541.1 / 445.9, 700.8, 1345.3 / 359.7, 695.0, 1343.3.
pub const BLOCKS_GEMV_MAX_TOKENS: usize = 2;

/// Fewest tokens the integer GEMV takes on the tensor cores, where the type has the kernel
/// (`gemv_mma_<type>`; `Gpu::gemv_mma_tokens`, RUSTLE_GEMV_MMA_TOKENS to measure others). Fewer stay on
/// `gemv_<type>`: the tensor cores' GEMV reads the weights at a little over half the speed
/// of `gemv_<type>`'s one token, and costs about the same for 1 to 8. On the H100, Llama 3
/// 8B's shape in Q4_K_M (`rustle bench --verify`, round 67): a pass of one sequence over
/// 1, 2, 3, 4 and 8 tokens took 1.00, 1.23, 2.08, 2.05 and 2.12 decode steps with
/// `gemv_<type>` for up to 2 tokens and `gemm_<type>` past them, 1.39, 1.41, 1.50, 1.50 and
/// 1.79 with this kernel from 1 token (1.00 being 2.664 ms); `rustle bench --batch`, 2
/// sequences at 603.6 tok/s on `gemv_<type>` and 524.3 here.
pub const MMA_GEMV_MIN_TOKENS: usize = 3;

impl Gpu {
    /// Most tokens of a decode step a matmul over GGUF blocks of `types` takes through the
    /// integer GEMV: RUSTLE_GEMV_TOKENS where set; all `QUANT_MAX_TOKENS` where every type
    /// has the GEMV on the tensor cores (`gemv_mma_<type>`, which multiplies 8 tokens for
    /// about the arithmetic of one); else `BLOCKS_GEMV_MAX_TOKENS`.
    pub fn decode_gemv_tokens(&self, types: &[BlockType]) -> usize {
        let mma = types
            .iter()
            .all(|&ty| self.gemv_on_mma(ty, QUANT_MAX_TOKENS));
        match (self.gemv_tokens_knob, mma) {
            (Some(n), _) => n,
            (None, true) => QUANT_MAX_TOKENS,
            (None, false) => BLOCKS_GEMV_MAX_TOKENS,
        }
    }
}

/// What a profile records: the launches, and what their byte counts need that the launches'
/// arguments do not carry (the batch's positions live on the device).
#[derive(Default)]
struct Profiling {
    launches: Vec<Pending>,
    /// `[n]` the positions of the batch last uploaded (`note_positions`).
    positions: Vec<u32>,
}

pub use crate::traffic::{KernelTime, Traffic};

struct Pending {
    kernel: &'static str,
    traffic: Traffic,
    start: CudaEvent,
    end: CudaEvent,
}

/// What `launches` puts on `stream`, recorded as a CUDA graph instead of run; `what` names
/// the graph in errors ("the decode graph"). The capture ends even where `launches` fails,
/// so that the stream takes launches again, and that failure is the one returned.
pub fn capture_graph(
    stream: &Arc<CudaStream>,
    what: &str,
    launches: impl FnOnce() -> Result<()>,
) -> Result<CudaGraph> {
    use sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let doing = format!("capturing {what}");
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(Error::driver(&doing))?;
    let recorded = launches();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(Error::driver(&doing));
    recorded?;
    graph?.ok_or_else(|| Error::Unsupported(format!("{doing} recorded nothing")))
}

impl Gpu {
    /// Device 0, or an error that says why there is none (no driver, no device).
    pub fn new() -> Result<Gpu> {
        // SAFETY: only asks whether libcuda can be loaded; cudarc would panic later if not.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoGpu(
                "no NVIDIA driver found (libcuda could not be loaded)".into(),
            ));
        }
        // With no device visible (none, or CUDA_VISIBLE_DEVICES empty) the driver's first
        // call fails with CUDA_ERROR_NO_DEVICE: that is no GPU, not a driver fault.
        let count = CudaContext::device_count().map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                Error::NoGpu("the NVIDIA driver reports no GPU".into())
            }
            _ => Error::driver("cannot query devices")(e),
        })?;
        if count < 1 {
            return Err(Error::NoGpu("the NVIDIA driver reports no GPU".into()));
        }
        let ctx = CudaContext::new(0).map_err(Error::driver("cannot open GPU 0"))?;
        // One stream, used in order: the per-buffer event tracking cudarc does for
        // several streams would only add work to every launch.
        // SAFETY: nothing here uses a second stream.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own rather than the legacy default one: CUDA graphs can capture it.
        let stream = ctx
            .new_stream()
            .map_err(Error::driver("cannot create a stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(Error::driver("compute capability"))?;
        let (built_in, target) = super::ptx::ptx_for(major, minor);
        // The tuning knobs (`knobs`: each unset is its default here).
        let knobs = crate::knobs::Knobs::from_env()?;
        // RUSTLE_PTX=FILE loads the kernels from that PTX instead: a kernel change measured
        // without rebuilding the engine. The file must hold every kernel of the table, with
        // the arguments this build passes.
        let ptx = match knobs.ptx {
            Some(path) => {
                std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })?
            }
            None => built_in.to_owned(),
        };
        // Programmatic dependent launch (Hopper and later): each kernel may start while the
        // one before it drains. RUSTLE_PDL=0 turns it off, to measure what it brings.
        let pdl = major >= 9 && knobs.pdl.unwrap_or(true);
        let mut hasher = DefaultHasher::new();
        ptx.hash(&mut hasher);
        let kernels_hash = hasher.finish();
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|source| Error::Driver {
                what: format!(
                    "cannot load the kernels' PTX (the driver may be too old for {target})"
                ),
                source,
            })?;
        let kernels = Kernels::load(&module)?;
        let name = ctx.name().unwrap_or_else(|_| "GPU".into());
        let total = ctx.total_mem().unwrap_or(0);
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(Error::driver("multiprocessor count"))? as usize;
        let gemm_slots = kernels.gemm_slots(sm_count)?;
        let gemv_stream =
            kernels.gemv_swiglu_stream_q4_k.is_some() && knobs.gemv_stream.unwrap_or(true);
        let stream_bytes = knobs.stream_bytes.unwrap_or(STREAM_BLOCK_BYTES);
        let stream_one_bytes = knobs.stream_one_bytes.unwrap_or(STREAM_ONE_BLOCK_BYTES);
        let stream_min_rows = knobs.stream_min_rows.unwrap_or(STREAM_MIN_ROWS);
        Ok(Gpu {
            profile: Arc::new(Mutex::new(None)),
            tensor_maps: Arc::default(),
            gemm_tune: knobs.gemm_tune.unwrap_or(true),
            kernels_hash,
            tuned_plans: Arc::default(),
            description: format!(
                "{name} (sm_{major}{minor}, {:.1} GiB)",
                total as f64 / (1u64 << 30) as f64
            ),
            sm_count,
            gemm_slots,
            pdl,
            gemv_stream,
            stream_bytes,
            stream_one_bytes,
            stream_min_rows,
            gemv_tokens_knob: knobs.gemv_tokens,
            gemv_mma_tokens: knobs.gemv_mma_tokens.unwrap_or(MMA_GEMV_MIN_TOKENS),
            ctx,
            stream,
            kernels,
        })
    }

    /// The device address of the Tensor Memory Accelerator's map `key` describes, made the
    /// first time (`tensor_maps`).
    pub fn tensor_map(&self, key: MapKey) -> Result<u64> {
        let mut maps = self.tensor_maps.lock().expect("tensor maps");
        maps.get_or_make(key, &self.stream)
    }

    /// The map of the `[rows, cols]` matrix `w` in boxes of `box_rows` rows (and one
    /// 128-byte row of columns): `tensor_map` of its key.
    pub fn matrix_map<T>(
        &self,
        w: &CudaView<T>,
        rows: usize,
        cols: usize,
        box_rows: usize,
    ) -> Result<u64> {
        let (addr, _sync) = w.device_ptr(&self.stream);
        self.tensor_map(MapKey {
            addr,
            rows,
            cols,
            elem_bytes: size_of::<T>(),
            box_rows,
        })
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> (usize, usize) {
        self.ctx.mem_get_info().unwrap_or((0, 0))
    }

    /// A zeroed device buffer of `n` elements; out of memory is an error naming `what`.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        let (free, total) = self.memory();
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| self.alloc_error(e, what, n * size_of::<T>(), free, total))
    }

    /// A device copy of `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T], what: &str) -> Result<CudaSlice<T>> {
        let (free, total) = self.memory();
        self.stream
            .clone_htod(data)
            .map_err(|e| self.alloc_error(e, what, std::mem::size_of_val(data), free, total))
    }

    fn alloc_error(
        &self,
        e: DriverError,
        what: &str,
        bytes: usize,
        free: usize,
        total: usize,
    ) -> Error {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            Error::GpuOutOfMemory {
                what: what.to_owned(),
                bytes,
                free,
                total,
            }
        } else {
            Error::Driver {
                what: format!("allocating {what}"),
                source: e,
            }
        }
    }

    /// From now on, every kernel launch is timed with a pair of CUDA events (outside graph
    /// capture only: events cannot be recorded into a graph this way).
    pub fn profile_start(&self) {
        *self.profile.lock().expect("profile lock") = Some(Profiling::default());
    }

    /// While profiling, remembers the positions of the batch the next launches run (the
    /// attention kernels' byte counts depend on them); otherwise does nothing.
    pub fn note_positions(&self, positions: &[u32]) {
        if let Some(p) = self.profile.lock().expect("profile lock").as_mut() {
            p.positions.clear();
            p.positions.extend_from_slice(positions);
        }
    }

    /// Stops profiling and returns each launch since `profile_start`, in order.
    pub fn profile_stop(&self) -> Result<Vec<KernelTime>> {
        self.sync()?;
        let pending = self
            .profile
            .lock()
            .expect("profile lock")
            .take()
            .unwrap_or_default()
            .launches;
        pending
            .into_iter()
            .map(|p| {
                let ms = p
                    .start
                    .elapsed_ms(&p.end)
                    .map_err(Error::driver("reading a kernel's events"))?
                    as f64;
                Ok(KernelTime {
                    kernel: p.kernel,
                    ms,
                    traffic: p.traffic,
                })
            })
            .collect()
    }

    /// Runs `launch` (one kernel launch), timed when profiling is on and counted by `traffic`.
    pub(crate) fn timed<T>(
        &self,
        kernel: &'static str,
        traffic: Traffic,
        launch: impl FnOnce() -> std::result::Result<T, DriverError>,
    ) -> Result<()> {
        self.timed_batch(kernel, |_| traffic, launch)
    }

    /// As `timed`, for a kernel whose bytes depend on the batch's positions: `traffic` gets
    /// them (those `note_positions` recorded), and runs only when profiling.
    pub(crate) fn timed_batch<T>(
        &self,
        kernel: &'static str,
        traffic: impl FnOnce(&[u32]) -> Traffic,
        launch: impl FnOnce() -> std::result::Result<T, DriverError>,
    ) -> Result<()> {
        let mut profile = self.profile.lock().expect("profile lock");
        let Some(p) = profile.as_mut() else {
            return launch().map(drop).map_err(Error::driver(kernel));
        };
        let event = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(Error::driver("profiling event"))
        };
        let (start, end) = (event()?, event()?);
        start
            .record(&self.stream)
            .map_err(Error::driver("profiling event"))?;
        launch().map_err(Error::driver(kernel))?;
        end.record(&self.stream)
            .map_err(Error::driver("profiling event"))?;
        let traffic = traffic(&p.positions);
        p.launches.push(Pending {
            kernel,
            traffic,
            start,
            end,
        });
        Ok(())
    }

    /// Waits for the stream and reports any error a kernel raised.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(Error::driver("a kernel failed"))
    }

    /// Hands the memory of buffers already dropped back to the driver. A dropped buffer goes
    /// back to the device's memory pool (`cuMemFreeAsync`), which keeps it reserved: free
    /// memory as `memory` reports it stays short of it until the pool is trimmed. Called
    /// before the KV pool takes most of what is free, after the GEMM plans' timing freed
    /// its copies of the matrices.
    pub fn release_freed(&self) -> Result<()> {
        self.sync()?;
        let device = self.ctx.cu_device();
        // SAFETY: the device is this context's; its default pool lives as long as the device.
        unsafe {
            let pool = cudarc::driver::result::device::get_default_mem_pool(device)
                .map_err(Error::driver("the device's memory pool"))?;
            cudarc::driver::result::mem_pool::trim_to(pool, 0)
                .map_err(Error::driver("the device's memory pool"))
        }
    }
}
