//! The quantized linear layers of one SmolLM2-135M forward (30 layers of q/k/v, o, gate/up,
//! down in Q4_1, the tied Q8_0 LM head) at the row counts of a decode step: 1 (plain step),
//! 5 / 17 / 65 (draft trees of budget 4 / 16 / 64 plus the root), in the float32 mode and the
//! int8 mode side by side.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use specdec_core::linear::{BlockFormat, QuantMatrix, BLOCK};

fn matrix(format: BlockFormat, rows: usize, cols: usize) -> QuantMatrix {
    let mut raw = vec![0u8; rows * cols / BLOCK * format.block_bytes()];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    for blk in raw.chunks_exact_mut(format.block_bytes()) {
        blk[..2].copy_from_slice(&0x2400u16.to_le_bytes()); // finite scales
        if format == BlockFormat::Q4_1 {
            blk[2..4].copy_from_slice(&0xa400u16.to_le_bytes());
        }
    }
    QuantMatrix::from_gguf(format, rows, cols, &raw).unwrap()
}

fn forward(c: &mut Criterion) {
    let q = BlockFormat::Q4_1;
    // 30 distinct layers, as in the model: the weights stream from memory, not cache.
    let layers: Vec<[QuantMatrix; 4]> = (0..30)
        .map(|_| {
            [
                matrix(q, 960, 576),
                matrix(q, 576, 576),
                matrix(q, 3072, 576),
                matrix(q, 576, 1536),
            ]
        })
        .collect();
    let layer = &layers[0];
    let head = matrix(BlockFormat::Q8_0, 49152, 576);
    let mut g = c.benchmark_group("smollm2_linears");
    g.sample_size(20);
    for m in [1usize, 5, 8, 17, 65] {
        let xs: Vec<Vec<f32>> = layer.iter().map(|w| vec![0.5; m * w.cols()]).collect();
        let mut outs: Vec<Vec<f32>> = layer.iter().map(|w| vec![0.0; m * w.rows()]).collect();
        let hx = vec![0.5; m * 576];
        let mut hout = vec![0.0; m * 49152];
        g.bench_with_input(BenchmarkId::new("forward", m), &m, |b, &m| {
            b.iter(|| {
                for layer in &layers {
                    for ((w, x), o) in layer.iter().zip(&xs).zip(outs.iter_mut()) {
                        w.matmul(x, m, o).unwrap();
                    }
                }
                head.matmul(&hx, m, &mut hout).unwrap();
            })
        });
        // The int8 mode on the same matrices, in the same run.
        g.bench_with_input(BenchmarkId::new("forward_int8", m), &m, |b, &m| {
            b.iter(|| {
                for layer in &layers {
                    for ((w, x), o) in layer.iter().zip(&xs).zip(outs.iter_mut()) {
                        w.matmul_int8(x, m, o).unwrap();
                    }
                }
                head.matmul_int8(&hx, m, &mut hout).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
