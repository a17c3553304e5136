//! The batch as the kernels read it: token ids, positions, each token's sequence, cache
//! slots and block tables, copied to the device before each pass. Block tables keep a fixed
//! row stride and a batch may be padded to a graph's bucket of rows, so that a captured
//! decode graph's arguments stay valid as sequences grow.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::In;
use super::kernels::attention::PagedIn;
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::kernel_args::{Heads, PagedShape};
use crate::tiles::BLOCK_SIZE;

/// Most sequences one forward pass may mix (the block-table buffer is sized for them).
pub const MAX_SEQS: usize = 256;

/// The batch's buffers on the device, and their staging on the host.
pub struct DeviceBatch {
    /// `[max_tokens]` each
    tokens: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    token_seq: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    /// `[MAX_SEQS, table_stride]`
    block_tables: CudaSlice<u32>,
    /// Row length of the device block tables: the most blocks one sequence can hold.
    pub table_stride: usize,
    /// The spare KV block padding rows write and read, which no sequence owns.
    pad_block: usize,
    /// Block tables as uploaded: `[n_seqs, table_stride]`.
    tables_host: Vec<u32>,
    /// The batch as uploaded, padding rows included.
    host: Batch,
}

/// The uploaded batch's first `n` rows, as the kernels take them.
pub struct BatchView<'a> {
    /// `[n]` token ids
    pub tokens: In<'a, u32>,
    /// `[n]` each token's position in its sequence
    pub positions: In<'a, u32>,
    /// `[n]` each token's sequence: its row of `block_tables`
    pub token_seq: In<'a, u32>,
    /// `[n]` each token's cache slot: block * BLOCK_SIZE + offset
    pub slots: In<'a, u32>,
    /// `[MAX_SEQS, max_blocks]` each sequence's blocks
    pub block_tables: In<'a, u32>,
    /// Row stride of `block_tables`.
    pub max_blocks: usize,
}

impl DeviceBatch {
    /// Buffers for passes of up to `max_tokens` tokens over sequences of up to
    /// `table_stride` blocks; padding rows live in block `pad_block`.
    pub fn new(
        gpu: &Gpu,
        max_tokens: usize,
        table_stride: usize,
        pad_block: usize,
    ) -> Result<DeviceBatch> {
        let ids = || gpu.zeros::<u32>(max_tokens, "the batch");
        Ok(DeviceBatch {
            tokens: ids()?,
            positions: ids()?,
            token_seq: ids()?,
            slots: ids()?,
            block_tables: gpu.zeros(MAX_SEQS * table_stride, "block tables")?,
            table_stride,
            pad_block,
            tables_host: vec![],
            host: Batch::default(),
        })
    }

    /// The first `n` rows of the uploaded batch.
    pub fn view(&self, n: usize) -> BatchView<'_> {
        BatchView {
            tokens: self.tokens.slice(..n),
            positions: self.positions.slice(..n),
            token_seq: self.token_seq.slice(..n),
            slots: self.slots.slice(..n),
            block_tables: self.block_tables.slice(..MAX_SEQS * self.table_stride),
            max_blocks: self.table_stride,
        }
    }

    /// Copies `batch` to the device, block tables at the fixed row stride, padded to `rows`
    /// rows: each padding row is a sequence of its own whose one token, at position 0,
    /// lives in the spare block, which no sequence owns.
    pub fn upload(&mut self, gpu: &Gpu, batch: &Batch, rows: usize) -> Result<()> {
        let n = batch.tokens.len();
        let stride = self.table_stride;
        let n_seqs = batch.block_tables.len() / batch.max_blocks.max(1);
        let pad = rows - n;
        assert!(
            rows <= self.tokens.len() && n_seqs + pad <= MAX_SEQS && batch.max_blocks <= stride
        );
        self.tables_host.clear();
        for row in batch.block_tables.chunks(batch.max_blocks.max(1)) {
            self.tables_host.extend_from_slice(row);
            self.tables_host
                .resize(self.tables_host.len() + stride - row.len(), 0);
        }
        let b = &mut self.host;
        b.tokens.clear();
        b.tokens.extend(&batch.tokens);
        b.positions.clear();
        b.positions.extend(&batch.positions);
        b.token_seq.clear();
        b.token_seq.extend(&batch.token_seq);
        b.slots.clear();
        b.slots.extend(&batch.slots);
        let spare = self.pad_block as u32;
        for i in 0..pad {
            b.tokens.push(0);
            b.positions.push(0);
            b.token_seq.push((n_seqs + i) as u32);
            b.slots.push(spare * BLOCK_SIZE as u32);
            self.tables_host.push(spare);
            self.tables_host
                .resize(self.tables_host.len() + stride - 1, 0);
        }
        let s = &gpu.stream;
        let up_err = Error::driver("copying the batch to the device");
        s.memcpy_htod(&b.tokens, &mut self.tokens.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.positions, &mut self.positions.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.token_seq, &mut self.token_seq.slice_mut(..rows))
            .map_err(up_err)?;
        s.memcpy_htod(&b.slots, &mut self.slots.slice_mut(..rows))
            .map_err(up_err)?;
        let len = self.tables_host.len();
        s.memcpy_htod(&self.tables_host, &mut self.block_tables.slice_mut(..len))
            .map_err(up_err)?;
        // The profiler's byte counts of attention need them (a no-op otherwise).
        gpu.note_positions(&self.host.positions);
        Ok(())
    }
}

impl<'a> BatchView<'a> {
    /// The queries `q` over one layer's cache, for these tokens, over the layer's sliding
    /// `window` where it has one.
    pub fn paged<K>(
        &self,
        q: In<'a, f32>,
        (k_cache, v_cache): (In<'a, K>, In<'a, K>),
        heads: Heads,
        window: Option<usize>,
    ) -> PagedIn<'a, K> {
        PagedIn {
            q,
            k_cache,
            v_cache,
            block_tables: self.block_tables.slice(..),
            token_seq: self.token_seq.slice(..),
            positions: self.positions.slice(..),
            shape: PagedShape::new(self.max_blocks, heads).windowed(window),
        }
    }
}
