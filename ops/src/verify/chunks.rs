//! The first pass over a table: its key range cut into chunks (an index walk), and every
//! chunk's checksum computed on both servers at once; the chunks that differ are narrowed
//! ([`super::narrow`]).

use std::time::{Duration, Instant};

use sluice_common::sql::mysql as my;

use super::catch_up::Pipeline;
use super::narrow::narrow;
use super::plan::{Chunk, Plan};
use super::render;
use super::report::TableReport;
use super::source::Source;
use super::target::Target;
use super::Options;

/// First pass: every chunk's checksum on both servers; then narrow the chunks that differ.
pub(super) async fn compare(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    options: &Options,
    plan: &Plan,
    report: &mut TableReport,
) -> Result<(), String> {
    use futures::StreamExt;
    let my_sum = format!(
        "SELECT COUNT(*), BIT_XOR({}) FROM {} WHERE ",
        render::mysql_hash(&plan.my_row()),
        plan.source_name()
    );
    // The chunks' bounds first (an index walk, cheap), then their checksums, `--parallel` at
    // a time, each on a connection of its own.
    let mut chunks = Vec::new();
    let mut conn = source.conn().await?;
    let mut lo: Option<String> = None;
    loop {
        let hi = if plan.ranged {
            let k = my::ident(&plan.key[0].0.name);
            let after = lo
                .as_ref()
                .map(|l| format!("WHERE {k} > {l} "))
                .unwrap_or_default();
            let sql = format!(
                "SELECT CAST({k} AS CHAR) FROM {} {after}ORDER BY {k} LIMIT 1 OFFSET {}",
                plan.source_name(),
                options.chunk_rows.max(1) - 1
            );
            Source::query::<String>(&mut conn, &sql)
                .await?
                .into_iter()
                .next()
        } else {
            None
        };
        chunks.push(Chunk {
            lo: lo.clone(),
            hi: hi.clone(),
        });
        match hi {
            Some(h) => lo = Some(h),
            None => break,
        }
    }
    drop(conn);
    let sums = futures::stream::iter(chunks)
        .map(|chunk| {
            let my_sql = format!("{my_sum}{}", plan.range(&chunk, my::ident));
            let ch_sql = format!(
                "SELECT count(), groupBitXor(_sluice_lh) FROM ({}) WHERE _sluice_ld = 0",
                plan.ch_latest(&chunk)
            );
            async move {
                let mut conn = source.conn().await?;
                let (mine, theirs) = tokio::join!(
                    Source::query::<(u64, Option<u64>)>(&mut conn, &my_sql),
                    target.query::<(u64, u64)>(&ch_sql)
                );
                let (rows, my_hash) = mine?.into_iter().next().unwrap_or((0, None));
                let theirs = theirs?.into_iter().next().unwrap_or((0, 0));
                Ok::<_, String>((chunk, rows, (rows, my_hash.unwrap_or(0)) != theirs))
            }
        })
        .buffered(options.parallel.max(1));
    futures::pin_mut!(sums);
    let mut differing = Vec::new();
    let mut last_progress = Instant::now();
    while let Some(sum) = sums.next().await {
        let (chunk, rows, differs) = sum?;
        report.rows += rows;
        report.chunks += 1;
        if differs {
            differing.push(chunk);
        }
        if options.progress && last_progress.elapsed() > Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "verify: {}: {} chunks, {} rows, {} to narrow",
                report.source,
                report.chunks,
                report.rows,
                differing.len()
            );
        }
    }
    report.chunks_narrowed = differing.len() as u64;
    if differing.is_empty() {
        return Ok(());
    }
    narrow(source, target, pipeline, options, plan, differing, report).await
}
