//! Files a simulation leaves behind: curves as CSV, a results.json, and a PNG plot of test
//! accuracy against virtual time (steps of a full-speed member), one line per topology.

use std::path::{Path, PathBuf};

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
    bytes_sent: u64,
    wall_seconds: f64,
    time_to_target: Option<f64>,
    full_speed_time_to_target: Option<f64>,
}

pub fn write_all(dir: &Path, results: &[TopologyResult]) -> Result<(), OutputError> {
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
            bytes_sent: r.bytes_sent,
            wall_seconds: r.wall_seconds,
            time_to_target: r.time_to_target,
            full_speed_time_to_target: r.full_speed_time_to_target,
        })
        .collect();
    let text =
        serde_json::to_string_pretty(&serde_json::json!({ "results": summary, "curves": results }))
            .expect("serializable");
    std::fs::write(&json, text + "\n").map_err(io(&json))?;
    plot(&dir.join("accuracy.png"), results)
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
                "{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{},{:.6}\n",
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

pub fn plot(path: &Path, results: &[TopologyResult]) -> Result<(), OutputError> {
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
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Mean test accuracy of {members} members"),
            ("sans-serif", 26),
        )
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..max_time, 0f64..100f64)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("test accuracy (%)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 240))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
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
            "{} ({}, {} edges): {:.1}%",
            r.topology,
            r.algorithm,
            r.edges,
            100.0 * r.final_test_accuracy
        );
        chart
            .draw_series(LineSeries::new(
                r.curve.iter().map(|p| (p.time, 100.0 * p.mean_accuracy)),
                colour.stroke_width(3),
            ))
            .map_err(|e| fail(e.to_string()))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 210))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}
