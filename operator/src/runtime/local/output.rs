//! `--output DIR`: what a run leaves behind besides the model the trainers write (`model/`) and
//! their logs (`logs/`): `summary.json`, `metrics.csv`, `events.json`, `topology.svg`, and
//! `loss.png` and `accuracy.png` (or the task's own metric, `perplexity.png`) with a line per
//! member.

use std::collections::BTreeMap;
use std::path::Path;

use murmur_core::api::NamedMetric;
use murmur_core::topology::{measure, render};
use plotters::prelude::*;

use super::{LocalError, Summary, io};
use crate::planner::JobState;
use crate::status::{JobHandle, JobView, SeriesPoint};

use murmur_core::assets::PLOT_FONT as FONT;

pub fn write(
    dir: &Path,
    summary: &Summary,
    view: &JobView,
    state: &JobState,
    job: &JobHandle,
) -> Result<(), LocalError> {
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(io(&path))
    };
    write(
        "summary.json",
        serde_json::to_string_pretty(summary)
            .expect("plain data")
            .as_bytes(),
    )?;
    let (series, _) = job.series(0);
    write("metrics.csv", metrics_csv(&series).as_bytes())?;
    write(
        "events.json",
        serde_json::to_string_pretty(&job.events(0).0)
            .expect("plain data")
            .as_bytes(),
    )?;
    write(
        "job.json",
        serde_json::to_string_pretty(view)
            .expect("plain data")
            .as_bytes(),
    )?;
    if let Some(t) = &state.topology {
        write("topology.svg", render::svg(t, &measure(t)).as_bytes())?;
    }
    let target = view.target_steps.unwrap_or(0);
    plot(
        &dir.join("loss.png"),
        "Training loss per member",
        "loss",
        &series,
        target,
        |p| p.progress.loss,
    )?;
    match metric_name(&series).as_str() {
        NamedMetric::ACCURACY => plot(
            &dir.join("accuracy.png"),
            "Test accuracy per member",
            "test accuracy (%)",
            &series,
            target,
            |p| p.progress.accuracy.map(|a| 100.0 * a),
        )?,
        name => plot(
            &dir.join(format!("{name}.png")),
            &format!("Test {name} per member"),
            &format!("test {name}"),
            &series,
            target,
            |p| p.progress.quality().map(|q| q.value),
        )?,
    }
    Ok(())
}

/// The name of the metric the series' task is judged by (accuracy until one says otherwise).
fn metric_name(series: &[SeriesPoint]) -> String {
    series
        .iter()
        .find_map(|p| p.progress.quality())
        .map_or_else(|| NamedMetric::ACCURACY.to_string(), |q| q.name)
}

/// One row per sample; the quality column is named after the task's metric.
pub fn metrics_csv(series: &[SeriesPoint]) -> String {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    let mut out = format!(
        "seconds,member,attempt,step,loss,{},consensus_distance\n",
        metric_name(series)
    );
    for p in series {
        out.push_str(&format!(
            "{:.3},{},{},{},{},{},{}\n",
            p.t,
            p.member,
            p.attempt,
            p.progress.step,
            opt(p.progress.loss),
            opt(p.progress.quality().map(|q| q.value)),
            opt(p.progress.consensus_distance)
        ));
    }
    out
}

fn plot(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[SeriesPoint],
    target_steps: u64,
    value: impl Fn(&SeriesPoint) -> Option<f64>,
) -> Result<(), LocalError> {
    let fail = |message: String| LocalError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(message),
    };
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| fail("embedded font is invalid".into()))?;
    let mut lines: BTreeMap<u32, Vec<(u64, f64)>> = BTreeMap::new();
    for p in series {
        if let Some(v) = value(p).filter(|v| v.is_finite()) {
            lines
                .entry(p.member)
                .or_default()
                .push((p.progress.step, v));
        }
    }
    let max_step = lines
        .values()
        .flatten()
        .map(|(s, _)| *s)
        .max()
        .unwrap_or(0)
        .max(target_steps)
        .max(1);
    let max_y = lines
        .values()
        .flatten()
        .map(|(_, v)| *v)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.05;
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_step, 0f64..max_y)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 240))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    for (member, mut points) in lines {
        points.sort_by_key(|(s, _)| *s);
        let colour = Palette99::pick(member as usize).to_rgba();
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(|e| fail(e.to_string()))?
            .label(format!("member {member}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 210))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_csv_has_a_row_per_sample_and_blanks_for_missing_values() {
        let csv = metrics_csv(&[SeriesPoint {
            t: 1.5,
            member: 2,
            attempt: 1,
            progress: murmur_core::api::Progress {
                step: 40,
                loss: Some(0.25),
                accuracy: None,
                metric: None,
                consensus_distance: Some(0.5),
            },
        }]);
        assert_eq!(
            csv,
            "seconds,member,attempt,step,loss,accuracy,consensus_distance\n1.500,2,1,40,0.25,,0.5\n"
        );
    }

    #[test]
    fn metrics_csv_names_its_quality_column_after_the_tasks_metric() {
        let mut progress = murmur_core::api::Progress {
            step: 40,
            ..Default::default()
        };
        progress.set_quality(NamedMetric {
            name: "perplexity".into(),
            value: 4.5,
            higher_is_better: false,
        });
        let csv = metrics_csv(&[SeriesPoint {
            t: 1.5,
            member: 2,
            attempt: 1,
            progress,
        }]);
        assert_eq!(
            csv,
            "seconds,member,attempt,step,loss,perplexity,consensus_distance\n1.500,2,1,40,,4.5,\n"
        );
    }
}
