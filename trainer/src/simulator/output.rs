//! Files a simulation leaves behind: curves as CSV, a results.json, and a PNG plot of test
//! accuracy (or, averaging alone, of the consensus distance on a log scale) against virtual time
//! (steps of a full-speed member), one line per topology.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;

use super::TopologyResult;

use murmur_core::assets::PLOT_FONT as FONT;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a results.json the simulator wrote: {message}")]
    Results { path: PathBuf, message: String },
    #[error("{path}: cannot draw the plot: {message}")]
    Plot { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Serialize)]
struct Summary<'a> {
    topology: &'a str,
    algorithm: &'a str,
    members: usize,
    final_test_accuracy: f64,
    edges: usize,
    spectral_gap: Option<f64>,
    bytes_sent: u64,
    cross_zone_bytes: Option<u64>,
    wall_seconds: f64,
    time_to_target: Option<f64>,
    full_speed_time_to_target: Option<f64>,
    steps_to_consensus: Option<u64>,
}

/// What a plot shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Mean test accuracy (accuracy.png).
    Accuracy,
    /// Consensus distance, log scale (consensus.png): for runs of averaging alone.
    Consensus,
}

impl Metric {
    pub fn file_name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy.png",
            Metric::Consensus => "consensus.png",
        }
    }
}

/// Below this a consensus distance is drawn as this (a log axis has no zero).
const CONSENSUS_FLOOR: f64 = 1e-9;

pub fn write_all(
    dir: &Path,
    results: &[TopologyResult],
    metric: Metric,
) -> Result<(), OutputError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let csv = dir.join("curves.csv");
    std::fs::write(&csv, curves_csv(results)).map_err(io(&csv))?;
    let json = dir.join("results.json");
    let summary: Vec<Summary> = results
        .iter()
        .map(|r| Summary {
            topology: &r.topology,
            algorithm: &r.algorithm,
            members: r.members,
            final_test_accuracy: r.final_test_accuracy,
            edges: r.edges,
            spectral_gap: r.spectral_gap,
            bytes_sent: r.bytes_sent,
            cross_zone_bytes: r.cross_zone_bytes,
            wall_seconds: r.wall_seconds,
            time_to_target: r.time_to_target,
            full_speed_time_to_target: r.full_speed_time_to_target,
            steps_to_consensus: r.steps_to_consensus,
        })
        .collect();
    let text =
        serde_json::to_string_pretty(&serde_json::json!({ "results": summary, "curves": results }))
            .expect("serializable");
    std::fs::write(&json, text + "\n").map_err(io(&json))?;
    plot(&dir.join(metric.file_name()), results, metric)
}

/// The curves of a `results.json` written by [`write_all`].
pub fn read_results(path: &Path) -> Result<Vec<TopologyResult>, OutputError> {
    #[derive(serde::Deserialize)]
    struct File {
        curves: Vec<TopologyResult>,
    }
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str::<File>(&text)
        .map(|f| f.curves)
        .map_err(|e| OutputError::Results {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

pub fn curves_csv(results: &[TopologyResult]) -> String {
    let mut out = String::from(
        "topology,algorithm,step,time,mean_accuracy,min_accuracy,max_accuracy,full_speed_accuracy,mean_test_loss,mean_train_loss,consensus_distance\n",
    );
    for r in results {
        for p in &r.curve {
            let train_loss = p
                .mean_train_loss
                .map_or(String::new(), |l| format!("{l:.6}"));
            out.push_str(&format!(
                "{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{},{:.6e}\n",
                r.topology,
                r.algorithm,
                p.step,
                p.time,
                p.mean_accuracy,
                p.min_accuracy,
                p.max_accuracy,
                p.full_speed_accuracy,
                p.mean_test_loss,
                train_loss,
                p.consensus_distance
            ));
        }
    }
    out
}

pub fn plot(path: &Path, results: &[TopologyResult], metric: Metric) -> Result<(), OutputError> {
    let fail = |message: String| OutputError::Plot {
        path: path.to_path_buf(),
        message,
    };
    // Registering twice is harmless; failing means the embedded font is broken.
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| fail("embedded font is invalid".into()))?;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let max_time = results
        .iter()
        .flat_map(|r| r.curve.iter().map(|p| p.time))
        .fold(1.0, f64::max);
    // With nobody slow, time is the step count; otherwise say what the axis is.
    let x_desc = if results
        .iter()
        .all(|r| r.curve.iter().all(|p| p.time == p.step as f64))
    {
        "step"
    } else {
        "time (steps of a full-speed member)"
    };
    let members = results.first().map_or(0, |r| r.members);
    let mut chart = ChartBuilder::on(&root);
    chart.margin(18).x_label_area_size(48).y_label_area_size(64);
    match metric {
        Metric::Accuracy => {
            let mut chart = chart
                .caption(
                    format!("Mean test accuracy of {members} members"),
                    ("sans-serif", 26),
                )
                .build_cartesian_2d(
                    0f64..max_time,
                    accuracy_range(
                        results
                            .iter()
                            .flat_map(|r| r.curve.iter().map(|p| p.mean_accuracy)),
                    ),
                )
                .map_err(|e| fail(e.to_string()))?;
            draw(
                &mut chart,
                results,
                Axes {
                    x: x_desc,
                    y: "test accuracy (%)",
                    y_labels: &|v| format!("{v:.0}"),
                    legend: SeriesLabelPosition::LowerRight,
                },
                |p| 100.0 * p.mean_accuracy,
                |r| format!("{:.1}%", 100.0 * r.final_test_accuracy),
            )
            .map_err(fail)?;
        }
        Metric::Consensus => {
            let top = results
                .iter()
                .flat_map(|r| r.curve.iter().map(|p| p.consensus_distance))
                .fold(1.0, f64::max);
            let mut chart = chart
                .caption(
                    format!("Consensus distance of {members} members, averaging alone"),
                    ("sans-serif", 26),
                )
                .build_cartesian_2d(0f64..max_time, (CONSENSUS_FLOOR..top * 2.0).log_scale())
                .map_err(|e| fail(e.to_string()))?;
            draw(
                &mut chart,
                results,
                Axes {
                    x: x_desc,
                    y: "mean distance to the average model",
                    y_labels: &|v| format!("{v:.0e}"),
                    legend: SeriesLabelPosition::UpperRight,
                },
                |p| p.consensus_distance.max(CONSENSUS_FLOOR),
                |r| match r.steps_to_consensus {
                    Some(steps) => format!("target in {steps}"),
                    None => "target not reached".into(),
                },
            )
            .map_err(fail)?;
        }
    }
    root.present().map_err(|e| fail(e.to_string()))
}

/// The accuracy axis (in %) for accuracies in [0, 1]: fitted to the curves, whole points, with a third of the span free
/// below them for the legend (curves rise to the right, so their ends stay clear of it).
pub fn accuracy_range(accuracies: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (low, high) = accuracies
        .map(|a| 100.0 * a)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), a| {
            (lo.min(a), hi.max(a))
        });
    if !low.is_finite() {
        return 0.0..100.0;
    }
    let span = (high - low).max(2.0);
    let bottom = (low - span / 2.0).floor().max(0.0);
    let top = (high + span / 20.0).ceil().min(100.0);
    bottom..top.max(bottom + 1.0)
}

/// How a plot's axes and legend read.
struct Axes<'s> {
    x: &'s str,
    y: &'s str,
    y_labels: &'s dyn Fn(&f64) -> String,
    legend: SeriesLabelPosition,
}

/// The mesh, one line per result (`y` of each curve point) and the legend (`outcome` of each).
fn draw<'a, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    results: &[TopologyResult],
    axes: Axes<'_>,
    y: impl Fn(&super::CurvePoint) -> f64,
    outcome: impl Fn(&TopologyResult) -> String,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(axes.x)
        .y_desc(axes.y)
        .y_label_formatter(axes.y_labels)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 240))
        .draw()
        .map_err(|e| e.to_string())?;
    let palette = [
        RGBColor(78, 121, 167),
        RGBColor(242, 142, 43),
        RGBColor(225, 87, 89),
        RGBColor(89, 161, 79),
        RGBColor(176, 122, 161),
        RGBColor(118, 183, 178),
        RGBColor(156, 117, 95),
    ];
    for (k, r) in results.iter().enumerate() {
        let colour = palette[k % palette.len()];
        let label = format!(
            "{} ({}, {} edges): {}",
            r.topology,
            r.algorithm,
            r.edges,
            outcome(r)
        );
        chart
            .draw_series(LineSeries::new(
                r.curve.iter().map(|p| (p.time, y(p))),
                colour.stroke_width(3),
            ))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(axes.legend)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 210))
        .draw()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::accuracy_range;

    #[test]
    fn the_accuracy_axis_fits_the_curves_and_leaves_room_for_the_legend() {
        // Curves between 80% and 93%: not 0-100.
        assert_eq!(accuracy_range([0.80, 0.90, 0.93].into_iter()), 73.0..94.0);
        // From chance to 92%: the whole climb, never below 0.
        assert_eq!(accuracy_range([0.10, 0.92].into_iter()), 0.0..97.0);
        // Flat curves still get a span; nothing above 100.
        assert_eq!(accuracy_range([0.995, 0.999].into_iter()), 98.0..100.0);
        assert_eq!(accuracy_range(std::iter::empty()), 0.0..100.0);
    }
}
