//! Nanoseconds per sample over a 49,152-entry vocabulary (the default model's),
//! greedy and top-k + top-p, one row at a time and as a 64-row parallel batch.
//!
//! Run: `cargo bench -p cortex-sample`

use std::hint::black_box;
use std::time::{Duration, Instant};

use cortex_request::SamplingParams;
use cortex_sample::{BatchRow, SampleRng, Sampler, sample_batch};

const VOCAB: usize = 49_152;
const BATCH: usize = 64;

/// Logits shaped like a language model's: a broad low floor and a few
/// dozen plausible tokens standing well above it.
fn model_like_logits(rng: &mut SampleRng) -> Vec<f32> {
    let mut logits: Vec<f32> = (0..VOCAB)
        .map(|_| (rng.next_f64() * 6.0 - 3.0) as f32)
        .collect();
    for _ in 0..40 {
        let token = (rng.next_u64() % VOCAB as u64) as usize;
        logits[token] = 8.0 + (rng.next_f64() * 8.0) as f32;
    }
    logits
}

fn time_per_item(items: usize, mut run: impl FnMut()) -> f64 {
    // Warm up, then repeat for at least half a second.
    run();
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < Duration::from_millis(500) {
        run();
        rounds += 1;
    }
    start.elapsed().as_nanos() as f64 / (f64::from(rounds) * items as f64)
}

fn main() {
    let mut rng = SampleRng::new(1);
    let rows: Vec<Vec<f32>> = (0..BATCH).map(|_| model_like_logits(&mut rng)).collect();
    let history: Vec<u32> = (0..64).map(|i| i * 7).collect();
    let configs = [
        ("greedy", SamplingParams::greedy()),
        (
            "top-k 40 + top-p 0.95, T 0.8",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                ..SamplingParams::default()
            },
        ),
        (
            "top-p 0.95, T 0.8 (no top-k)",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                ..SamplingParams::default()
            },
        ),
        (
            "T 1.0 + penalties (full softmax)",
            SamplingParams {
                repetition_penalty: 1.1,
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
        ),
    ];

    println!(
        "vocabulary {VOCAB}, batch {BATCH}, {} rayon threads",
        rayon::current_num_threads()
    );
    println!(
        "{:<34} {:>14} {:>22}",
        "sampler", "1 row ns/row", "64-row batch ns/row"
    );
    let mut scratch = rows[0].clone();
    let copy = time_per_item(1, || {
        scratch.copy_from_slice(black_box(&rows[0]));
        black_box(&mut scratch);
    });
    println!("{:<34} {copy:>14.0}", "(copying one logits row)");
    for (name, params) in configs {
        let mut sampler = Sampler::new(params.clone(), 0);
        let mut scratch = rows[0].clone();
        let single = time_per_item(1, || {
            scratch.copy_from_slice(&rows[0]);
            black_box(sampler.sample(&mut scratch, &history));
        });

        let mut samplers: Vec<Sampler> = (0..BATCH as u64)
            .map(|i| Sampler::new(params.clone(), i))
            .collect();
        let mut buffers = rows.clone();
        let batch = time_per_item(BATCH, || {
            for (buffer, row) in buffers.iter_mut().zip(&rows) {
                buffer.copy_from_slice(row);
            }
            let mut batch: Vec<BatchRow<'_>> = samplers
                .iter_mut()
                .zip(buffers.iter_mut())
                .map(|(sampler, logits)| BatchRow {
                    sampler,
                    logits,
                    history: &history,
                    constraint: None,
                })
                .collect();
            black_box(sample_batch(&mut batch));
        });
        println!("{name:<34} {single:>14.0} {batch:>22.0}");
    }
    println!("(each figure includes copying the 196 KB logits row, as an engine does)");
}
