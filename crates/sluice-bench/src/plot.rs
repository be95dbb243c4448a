//! A PNG of a sweep: throughput and latency percentiles against concurrency.
//!
//! Text is drawn with a font compiled into the binary (Noto Sans, through ab_glyph), so a plot
//! renders the same on a bare machine without fontconfig or system fonts.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{ensure, Context};
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::report::Summary;
use crate::workload::Load;

/// The numbers one sweep level contributes to the plot.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    pub concurrency: usize,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
}

pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 900;
const FONT: &str = "sans-serif";

/// The closed-loop summaries as points, by concurrency; open-loop ones have no place here.
pub fn points_from_summaries(results: &[Summary]) -> Vec<SweepPoint> {
    let mut points: Vec<SweepPoint> = results
        .iter()
        .filter_map(|r| match r.load {
            Load::Closed { concurrency } => Some(SweepPoint {
                concurrency,
                output_throughput: r.output_throughput,
                total_token_throughput: r.total_token_throughput,
                ttft_p50_ms: r.ttft_ms.p50,
                ttft_p99_ms: r.ttft_ms.p99,
                itl_p50_ms: r.itl_ms.p50,
                itl_p99_ms: r.itl_ms.p99,
            }),
            Load::Poisson { .. } => None,
        })
        .collect();
    points.sort_by_key(|p| p.concurrency);
    points
}

/// The points of a CSV that `--csv` wrote, found by column name; open-loop rows are skipped.
pub fn points_from_csv(text: &str) -> anyhow::Result<Vec<SweepPoint>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .context("the CSV is empty")?
        .split(',')
        .map(str::trim)
        .collect();
    let column = |name: &str| {
        header.iter().position(|h| *h == name).with_context(|| {
            format!("the CSV has no `{name}` column (write it with sluice-bench --csv)")
        })
    };
    let cols = [
        column("concurrency")?,
        column("output_throughput")?,
        column("total_token_throughput")?,
        column("ttft_p50_ms")?,
        column("ttft_p99_ms")?,
        column("itl_p50_ms")?,
        column("itl_p99_ms")?,
    ];
    let mut points = Vec::new();
    for (i, line) in lines.enumerate() {
        let row = i + 2;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: usize| fields.get(c).copied().unwrap_or("");
        if field(cols[0]).is_empty() {
            continue; // an open-loop row: it has a request rate, not a concurrency
        }
        let concurrency: usize = field(cols[0])
            .parse()
            .with_context(|| format!("row {row}: bad concurrency `{}`", field(cols[0])))?;
        ensure!(concurrency > 0, "row {row}: concurrency must be positive");
        let mut nums = [0.0; 6];
        for (n, &c) in nums.iter_mut().zip(&cols[1..]) {
            *n = field(c)
                .parse()
                .with_context(|| format!("row {row}: `{}` is not a number", field(c)))?;
        }
        let [output_throughput, total_token_throughput, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms] =
            nums;
        points.push(SweepPoint {
            concurrency,
            output_throughput,
            total_token_throughput,
            ttft_p50_ms,
            ttft_p99_ms,
            itl_p50_ms,
            itl_p99_ms,
        });
    }
    ensure!(
        !points.is_empty(),
        "the CSV has no closed-loop rows to plot"
    );
    points.sort_by_key(|p| p.concurrency);
    Ok(points)
}

/// Renders the points and writes the PNG to `path`.
pub fn write_png(
    path: &Path,
    points: &[SweepPoint],
    title: &str,
    subtitle: Option<&str>,
) -> anyhow::Result<()> {
    let png = render_png(points, title, subtitle)?;
    std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
}

/// The plot as PNG bytes: tokens/s above, latency percentiles (log scale) below, both against
/// concurrency on a log axis with a tick at each level.
pub fn render_png(
    points: &[SweepPoint],
    title: &str,
    subtitle: Option<&str>,
) -> anyhow::Result<Vec<u8>> {
    ensure!(!points.is_empty(), "nothing to plot: no closed-loop levels");
    embed_font()?;
    let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, points, title, subtitle)?;
        root.present()?;
    }
    let mut png = Vec::new();
    let mut encoder = png::Encoder::new(&mut png, WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&rgb)?;
    writer.finish()?;
    Ok(png)
}

/// Registers the embedded font as plotters' sans-serif, once per process.
fn embed_font() -> anyhow::Result<()> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED
        .get_or_init(|| register_font(FONT, FontStyle::Normal, ttf_noto_sans::REGULAR).is_ok());
    ensure!(loaded, "the embedded font failed to load");
    Ok(())
}

type LogAxis = WithKeyPoints<LogCoord<f64>>;

/// Concurrency on a log axis, padded either side, with a tick at each level (at most ~12).
fn x_axis(points: &[SweepPoint]) -> LogAxis {
    let levels: Vec<f64> = points.iter().map(|p| p.concurrency as f64).collect();
    let (lo, hi) = (levels[0], levels[levels.len() - 1]);
    let (lo, hi) = if lo == hi {
        (lo / 2.0, hi * 2.0)
    } else {
        (lo / 1.25, hi * 1.25)
    };
    let mut ticks = levels.clone();
    ticks.dedup();
    if ticks.len() > 12 {
        let step = ticks.len().div_ceil(12);
        let last = ticks[ticks.len() - 1];
        ticks = ticks.into_iter().step_by(step).collect();
        if ticks.last() != Some(&last) {
            ticks.push(last);
        }
    }
    (lo..hi).log_scale().with_key_points(ticks)
}

/// A log axis over `lo..hi` labelled at 1-2-5 steps (only at powers of ten when those would
/// crowd it), with light lines at every multiple in between.
fn log_axis(lo: f64, hi: f64) -> LogAxis {
    let mut bold = Vec::new();
    let mut light = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in 1..10 {
            let v = decade * m as f64;
            if (lo..=hi).contains(&v) {
                light.push(v);
                if [1, 2, 5].contains(&m) {
                    bold.push(v);
                }
            }
        }
        decade *= 10.0;
    }
    if bold.len() > 10 {
        bold.retain(|v| (v.log10() - v.log10().round()).abs() < 1e-9);
    }
    (lo..hi)
        .log_scale()
        .with_key_points(bold)
        .with_light_points(light)
}

/// A tick label without trailing zeros.
fn tick(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

struct Series {
    label: &'static str,
    color: RGBColor,
    /// p99 lines are dashed with triangles; the rest solid with dots.
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn draw(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    points: &[SweepPoint],
    title: &str,
    subtitle: Option<&str>,
) -> anyhow::Result<()> {
    root.fill(&WHITE)?;
    let mut area = root.titled(title, (FONT, 26))?;
    if let Some(sub) = subtitle {
        area = area.titled(sub, (FONT, 16).into_font().color(&RGBColor(90, 90, 90)))?;
    }
    let panels = area.split_evenly((2, 1));
    let x = |p: &SweepPoint| p.concurrency as f64;
    const BLUE: RGBColor = RGBColor(31, 119, 180);
    const ORANGE: RGBColor = RGBColor(255, 127, 14);
    const RED: RGBColor = RGBColor(214, 39, 40);
    const GREEN: RGBColor = RGBColor(44, 160, 44);

    // Throughput, linear from zero.
    let throughput = [
        Series {
            label: "output tokens/s",
            color: BLUE,
            dashed: false,
            points: points.iter().map(|p| (x(p), p.output_throughput)).collect(),
        },
        Series {
            label: "total tokens/s (prompt + output)",
            color: ORANGE,
            dashed: false,
            points: points
                .iter()
                .map(|p| (x(p), p.total_token_throughput))
                .collect(),
        },
    ];
    let top = throughput
        .iter()
        .flat_map(|s| s.points.iter().map(|&(_, y)| y))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.12 } else { 1.0 };
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("Throughput", (FONT, 20))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_axis(points), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("concurrency (requests in flight)")
        .y_desc("tokens/s")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.05))
        .max_light_lines(2)
        .draw()?;
    for s in &throughput {
        draw_series(&mut chart, s)?;
    }
    legend(&mut chart)?;

    // Latency percentiles, log scale: TTFT and ITL are often orders of magnitude apart.
    // Zeros (a level where every request failed) have no place on a log axis.
    let positive = |ys: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        ys.into_iter()
            .filter(|&(_, y)| y > 0.0 && y.is_finite())
            .collect()
    };
    let latency = [
        Series {
            label: "TTFT p50",
            color: RED,
            dashed: false,
            points: positive(points.iter().map(|p| (x(p), p.ttft_p50_ms)).collect()),
        },
        Series {
            label: "TTFT p99",
            color: RED,
            dashed: true,
            points: positive(points.iter().map(|p| (x(p), p.ttft_p99_ms)).collect()),
        },
        Series {
            label: "ITL p50",
            color: GREEN,
            dashed: false,
            points: positive(points.iter().map(|p| (x(p), p.itl_p50_ms)).collect()),
        },
        Series {
            label: "ITL p99",
            color: GREEN,
            dashed: true,
            points: positive(points.iter().map(|p| (x(p), p.itl_p99_ms)).collect()),
        },
    ];
    let ys = || {
        latency
            .iter()
            .flat_map(|s| s.points.iter().map(|&(_, y)| y))
    };
    let (lo, hi) = (ys().fold(f64::INFINITY, f64::min), ys().fold(0.0, f64::max));
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.6, hi * 1.6)
    } else {
        (1.0, 1000.0)
    };
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("Latency", (FONT, 20))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_axis(points), log_axis(lo, hi))?;
    chart
        .configure_mesh()
        .x_desc("concurrency (requests in flight)")
        .y_desc("ms (log scale)")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.05))
        .draw()?;
    for s in &latency {
        draw_series(&mut chart, s)?;
    }
    legend(&mut chart)?;
    Ok(())
}

fn draw_series<'a, 'b: 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogAxis, Y>>,
    s: &Series,
) -> anyhow::Result<()> {
    let (color, line) = (s.color, s.color.stroke_width(2));
    if s.dashed {
        chart
            .draw_series(DashedLineSeries::new(s.points.clone(), 9, 6, line))?
            .label(s.label)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (10, 0)], line)
                    + PathElement::new(vec![(22, 0), (32, 0)], line)
                    + TriangleMarker::new((16, 0), 5, color.filled())
            });
        chart.draw_series(
            s.points
                .iter()
                .map(|&p| TriangleMarker::new(p, 5, color.filled())),
        )?;
    } else {
        chart
            .draw_series(LineSeries::new(s.points.clone(), line))?
            .label(s.label)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (32, 0)], line)
                    + Circle::new((16, 0), 4, color.filled())
            });
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    Ok(())
}

fn legend<'a, 'b: 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogAxis, Y>>,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 15))
        .margin(12)
        .legend_area_size(44)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report;

    fn sweep() -> Vec<SweepPoint> {
        [1usize, 4, 16, 64]
            .iter()
            .map(|&c| {
                let c = c as f64;
                SweepPoint {
                    concurrency: c as usize,
                    output_throughput: 60.0 * c / (1.0 + c / 32.0),
                    total_token_throughput: 120.0 * c / (1.0 + c / 32.0),
                    ttft_p50_ms: 20.0 + 4.0 * c,
                    ttft_p99_ms: 35.0 + 9.0 * c,
                    itl_p50_ms: 16.0 + 0.3 * c,
                    itl_p99_ms: 25.0 + 0.8 * c,
                }
            })
            .collect()
    }

    fn decode(png_bytes: &[u8]) -> (png::OutputInfo, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        let mut reader = decoder.read_info().expect("a PNG header");
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).expect("PNG image data");
        buf.truncate(info.buffer_size());
        (info, buf)
    }

    /// Pixels in rows `rows` that are not the white background.
    fn inked(info: &png::OutputInfo, rgb: &[u8], rows: std::ops::Range<u32>) -> usize {
        let stride = info.width as usize * 3;
        rows.flat_map(|y| rgb[y as usize * stride..(y as usize + 1) * stride].chunks(3))
            .filter(|px| px != &[255, 255, 255])
            .count()
    }

    #[test]
    fn writes_a_png_with_plot_and_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.png");
        write_png(&path, &sweep(), "test-model", Some("synthetic sweep")).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let (info, rgb) = decode(&bytes);
        assert_eq!((info.width, info.height), (WIDTH, HEIGHT));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        // The background is white and most of the canvas is background...
        assert_eq!(&rgb[..3], &[255, 255, 255]);
        let total = inked(&info, &rgb, 0..HEIGHT);
        assert!(
            total < (WIDTH * HEIGHT / 2) as usize,
            "{total} inked pixels"
        );
        // ...but axes, lines and labels are drawn,
        assert!(total > 10_000, "only {total} inked pixels");
        // the title strip (text only) has glyphs in it: the embedded font renders,
        let title = inked(&info, &rgb, 0..30);
        assert!(title > 100, "only {title} inked pixels in the title strip");
        // and the series colours are there: output tokens/s (blue) and TTFT (red).
        let has = |c: [u8; 3]| rgb.chunks(3).any(|px| px == c);
        assert!(has([31, 119, 180]) && has([214, 39, 40]));
    }

    #[test]
    fn single_level_and_failed_level_still_render() {
        let mut one = sweep()[..1].to_vec();
        let png = render_png(&one, "one level", None).unwrap();
        let (info, rgb) = decode(&png);
        assert!(inked(&info, &rgb, 0..HEIGHT) > 10_000);
        // Every request failed: zero latencies are left off the log axis.
        one[0].ttft_p50_ms = 0.0;
        one[0].ttft_p99_ms = 0.0;
        one[0].itl_p50_ms = 0.0;
        one[0].itl_p99_ms = 0.0;
        one[0].output_throughput = 0.0;
        one[0].total_token_throughput = 0.0;
        render_png(&one, "all failed", None).unwrap();
        assert!(render_png(&[], "empty", None).is_err());
    }

    #[test]
    fn csv_round_trips_into_points() {
        use crate::client::Outcome;
        use std::time::Duration;
        let outcome = |ttft: u64, e2e: u64| Outcome {
            prompt_tokens: 10,
            output_tokens: 5,
            ttft: Duration::from_millis(ttft),
            itl: vec![Duration::from_millis(7); 4],
            e2e: Duration::from_millis(e2e),
            finished_at: Duration::from_millis(e2e),
            ..Outcome::default()
        };
        let results = vec![
            Summary::new(Load::Closed { concurrency: 8 }, &[outcome(40, 200)]),
            Summary::new(Load::Closed { concurrency: 2 }, &[outcome(12, 100)]),
            Summary::new(Load::Poisson { rate: 3.0 }, &[outcome(5, 50)]),
        ];
        let direct = points_from_summaries(&results);
        assert_eq!(
            direct.iter().map(|p| p.concurrency).collect::<Vec<_>>(),
            [2, 8]
        );
        let parsed = points_from_csv(&report::csv(&results)).unwrap();
        assert_eq!(parsed.len(), 2);
        for (a, b) in parsed.iter().zip(&direct) {
            assert_eq!(a.concurrency, b.concurrency);
            for (x, y) in [
                (a.output_throughput, b.output_throughput),
                (a.total_token_throughput, b.total_token_throughput),
                (a.ttft_p50_ms, b.ttft_p50_ms),
                (a.ttft_p99_ms, b.ttft_p99_ms),
                (a.itl_p50_ms, b.itl_p50_ms),
                (a.itl_p99_ms, b.itl_p99_ms),
            ] {
                assert!((x - y).abs() < 0.01, "{x} vs {y}");
            }
        }
        assert_eq!(parsed[0].ttft_p50_ms, 12.0);
        assert_eq!(parsed[1].itl_p99_ms, 7.0);
    }

    #[test]
    fn csv_errors_are_explained() {
        let err = points_from_csv("concurrency,completed\n1,3\n").unwrap_err();
        assert!(err.to_string().contains("output_throughput"), "{err}");
        assert!(points_from_csv("").is_err());
        let header = report::csv(&[]);
        let err = points_from_csv(&header).unwrap_err();
        assert!(err.to_string().contains("no closed-loop rows"), "{err}");
        let bad = format!("{header}4,,1,0,1,1,x,2,3,4,5,6,7,8,9,10\n");
        let err = points_from_csv(&bad).unwrap_err();
        assert!(err.to_string().contains("row 2"), "{err}");
    }

    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(tick(16.0), "16");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1234.4), "1234");
    }
}
