//! SVG line charts for `equarx simulate --plot` and `equarx model --plot`:
//! log–log axes, one line per series, a legend.

use plotters::prelude::*;

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Axis labels and title.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_y: bool,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Renders `series` as an SVG document (log x axis).
pub fn svg(chart: &Chart, series: &[Series]) -> Result<String, String> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 >= x1 || !(y0.is_finite() && y1.is_finite()) || x0 <= 0.0 {
        return Err("nothing to plot".into());
    }
    let (y0, y1) = if chart.log_y {
        (y0 * 0.8, y1 * 1.25)
    } else {
        (0.0f64.min(y0), y1 * 1.1)
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(chart.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65);
        let style = |c: &RGBColor| c.stroke_width(2);
        macro_rules! draw {
            ($ctx:expr) => {{
                let mut ctx = $ctx;
                ctx.configure_mesh()
                    .x_desc(chart.x_label)
                    .y_desc(chart.y_label)
                    .draw()
                    .map_err(|e| e.to_string())?;
                for (k, s) in series.iter().enumerate() {
                    let color = PALETTE[k % PALETTE.len()];
                    ctx.draw_series(LineSeries::new(s.points.iter().copied(), style(&color)))
                        .map_err(|e| e.to_string())?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], style(&color))
                        });
                    ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(|e| e.to_string())?;
                }
                ctx.configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }};
        }
        if chart.log_y {
            draw!(
                builder
                    .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                    .map_err(|e| e.to_string())?
            );
        } else {
            draw!(
                builder
                    .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                    .map_err(|e| e.to_string())?
            );
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_an_svg_with_every_series_in_the_legend() {
        let s = svg(
            &Chart {
                title: "t",
                x_label: "x",
                y_label: "y",
                log_y: true,
            },
            &[
                Series {
                    label: "first".into(),
                    points: vec![(1.0, 1.0), (10.0, 2.0)],
                },
                Series {
                    label: "second".into(),
                    points: vec![(1.0, 3.0), (10.0, 4.0)],
                },
            ],
        )
        .unwrap();
        assert!(s.starts_with("<svg") && s.contains("first") && s.contains("second"));
        assert!(
            svg(
                &Chart {
                    title: "",
                    x_label: "",
                    y_label: "",
                    log_y: false
                },
                &[]
            )
            .is_err()
        );
    }
}
