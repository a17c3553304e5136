//! Tensor maps: what the Tensor Memory Accelerator needs to copy a tile of a matrix, made by
//! the driver on the host (`cuTensorMapEncodeTiled`) and kept in device memory, where the
//! warpgroup GEMM reads them (`gemm_wgmma.rs`: a tile of the weights each step, copied by
//! one instruction of its producer warp).
//!
//! A map says where a 2-D tensor starts, its sizes and row stride, the box a copy moves, and
//! the swizzle the copy lays the box out in (the 128-byte one `wgmma`'s descriptors name).
//! It depends on nothing but those, so one map serves every launch of the same matrix and
//! box: the maps are made once, cached by what they describe. A CUDA graph replays the
//! launches it captured, maps and all, so every map a captured launch uses must exist
//! before the capture: `GpuBackend::new` makes the weights' maps when the model arrives,
//! and a map asked for during a capture is an error rather than a copy the graph would hold.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUstreamCaptureStatus, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::{Error, Result};

/// Bytes of one map, as the driver lays it out (and as the copy instructions want it
/// aligned: 64 bytes; the slots here are 128).
const MAP_BYTES: usize = 128;
/// Maps in one device allocation; a full one is kept and another made, so that a map's
/// address never changes once a launch has named it.
const MAPS_PER_CHUNK: usize = 64;

/// What a map describes: a row-major `[rows, cols]` matrix of `elem_bytes`-byte elements at
/// `addr`, copied in boxes of `box_cols x box_rows` (columns of one 128-byte swizzled row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MapKey {
    pub addr: u64,
    pub rows: usize,
    pub cols: usize,
    pub elem_bytes: usize,
    pub box_rows: usize,
}

impl MapKey {
    /// Columns a box spans: one 128-byte row of the swizzle.
    pub fn box_cols(&self) -> usize {
        128 / self.elem_bytes
    }
}

/// The maps made so far, and the device memory that holds them.
#[derive(Default)]
pub struct TensorMaps {
    made: HashMap<MapKey, u64>,
    chunks: Vec<CudaSlice<u8>>,
    /// Maps in the last chunk.
    used: usize,
}

impl TensorMaps {
    /// The device address of the map `key` describes, made (and copied to the device on
    /// `stream`) the first time it is asked for. An error during a graph's capture: the copy
    /// would not be part of the stream's work before the capture began.
    pub fn get_or_make(&mut self, key: MapKey, stream: &Arc<CudaStream>) -> Result<u64> {
        if let Some(&addr) = self.made.get(&key) {
            return Ok(addr);
        }
        let capturing = stream
            .capture_status()
            .map_err(Error::driver("capture status"))?;
        if capturing != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::Unsupported(format!(
                "a tensor map for a {} x {} matrix was first asked for inside a CUDA graph; \
                 the weights' maps are made when the model loads (GpuBackend::new)",
                key.rows, key.cols
            )));
        }
        let bytes = encode(&key)?;
        if self.chunks.is_empty() || self.used == MAPS_PER_CHUNK {
            let chunk = stream
                .alloc_zeros::<u8>(MAP_BYTES * MAPS_PER_CHUNK)
                .map_err(Error::driver("allocating tensor maps"))?;
            self.chunks.push(chunk);
            self.used = 0;
        }
        let slot = self.used * MAP_BYTES;
        self.used += 1;
        let chunk = self.chunks.last_mut().expect("a chunk");
        let mut dst = chunk.slice_mut(slot..slot + MAP_BYTES);
        stream
            .memcpy_htod(&bytes, &mut dst)
            .map_err(Error::driver("copying a tensor map"))?;
        let (base, _sync) = chunk.device_ptr(stream);
        let addr = base + slot as u64;
        self.made.insert(key, addr);
        Ok(addr)
    }
}

/// The driver's encoding of the map `key` describes: 128-byte swizzle, zeros outside the
/// matrix, the L2 fetched 256 bytes at a time.
fn encode(key: &MapKey) -> Result<[u8; MAP_BYTES]> {
    let data_type = match key.elem_bytes {
        1 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        b => {
            return Err(Error::Unsupported(format!(
                "a tensor map of {b}-byte elements"
            )));
        }
    };
    let row_bytes = key.cols * key.elem_bytes;
    let fits = key.addr.is_multiple_of(16)
        && row_bytes.is_multiple_of(16)
        && (1..=256).contains(&key.box_rows)
        && key.rows > 0;
    if !fits {
        return Err(Error::Unsupported(format!(
            "a tensor map needs 16-byte aligned rows and a box of 1 to 256 rows: {key:?}"
        )));
    }
    // Sizes and strides innermost first; the innermost stride (one element) is implied.
    let dims = [key.cols as u64, key.rows as u64];
    let strides = [row_bytes as u64];
    let boxes = [key.box_cols() as u32, key.box_rows as u32];
    let element_strides = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    // SAFETY: every array is as long as the rank (2) says, the strides one shorter; the
    // address is the device's, checked aligned above; the map is written, not read.
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            2,
            key.addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    result
        .result()
        .map_err(Error::driver("encoding a tensor map"))?;
    // SAFETY: the driver wrote the map (and it was zeroed before).
    let map = unsafe { map.assume_init() };
    let mut bytes = [0u8; MAP_BYTES];
    for (to, word) in bytes.chunks_exact_mut(8).zip(map.opaque) {
        to.copy_from_slice(&word.to_le_bytes());
    }
    Ok(bytes)
}
