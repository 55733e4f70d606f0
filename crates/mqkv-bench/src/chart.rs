//! A small PNG line-chart renderer: throughput versus concurrency, one panel per workload,
//! one line per server. Text uses the public-domain 8x8 bitmap font of `font8x8`.

use std::path::Path;

use anyhow::{Context, Result};

use crate::report::{fmt_size, RunResult};
use crate::servers::Target;

type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [20, 20, 20];
const GRID: Rgb = [225, 225, 225];
const AXIS: Rgb = [120, 120, 120];

fn color(target: Target) -> Rgb {
    match target {
        Target::Mqkv => [31, 119, 180],
        Target::MqkvDisk => [148, 103, 189],
        Target::MqkvPolicy => [23, 190, 207],
        Target::Redis => [214, 39, 40],
        Target::RedisAof => [255, 127, 14],
        Target::Mosquitto => [44, 160, 44],
    }
}

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Canvas {
        Canvas {
            w,
            h,
            px: WHITE.repeat(w * h),
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x as usize >= self.w || y as usize >= self.h {
            return;
        }
        let i = (y as usize * self.w + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&c);
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, c);
            }
        }
    }

    /// A line `thick` pixels wide; with `dash`, drawn 6 on, 4 off.
    fn line(&mut self, from: (i64, i64), to: (i64, i64), c: Rgb, thick: i64, dash: bool) {
        let ((x0, y0), (x1, y1)) = (from, to);
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let mut step = 0u32;
        loop {
            if !dash || step % 10 < 6 {
                self.rect(x - thick / 2, y - thick / 2, thick, thick, c);
            }
            step += 1;
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text with its top-left corner at (x, y), each font pixel `scale` pixels wide.
    fn text(&mut self, x: i64, y: i64, s: &str, c: Rgb, scale: i64) {
        for (i, ch) in s.chars().enumerate() {
            let code = if ch.is_ascii() {
                ch as usize
            } else {
                b'?' as usize
            };
            let glyph = font8x8::legacy::BASIC_LEGACY[code];
            let gx = x + i as i64 * 8 * scale;
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits >> col & 1 == 1 {
                        self.rect(gx + col * scale, y + row as i64 * scale, scale, scale, c);
                    }
                }
            }
        }
    }

    fn text_width(s: &str, scale: i64) -> i64 {
        s.chars().count() as i64 * 8 * scale
    }

    fn save(&self, path: &Path) -> Result<()> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut enc =
            png::Encoder::new(std::io::BufWriter::new(file), self.w as u32, self.h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&self.px)?;
        writer.finish()?;
        Ok(())
    }
}

/// One line of a panel.
pub struct Series {
    pub label: String,
    pub color: Rgb,
    pub dashed: bool,
    /// (concurrency, throughput)
    pub points: Vec<(usize, f64)>,
}

pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

fn nice_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

fn draw_panel(c: &mut Canvas, p: &Panel, x0: i64, y0: i64, w: i64, h: i64) {
    c.text(x0 + 10, y0 + 8, &p.title, BLACK, 1);
    let (left, right, top, bottom) = (x0 + 56, x0 + w - 14, y0 + 28, y0 + h - 34);
    let mut xs: Vec<usize> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_unstable();
    xs.dedup();
    let max = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    if xs.is_empty() || max <= 0.0 {
        c.text(left + 10, top + 40, "no data", AXIS, 1);
        return;
    }
    let step = nice_step(max * 1.05);
    let ymax = (max * 1.05 / step).ceil() * step;
    let ypix = |v: f64| bottom - ((v / ymax) * (bottom - top) as f64).round() as i64;
    let xpix = |conc: usize| {
        let i = xs.iter().position(|x| *x == conc).unwrap_or(0) as i64;
        if xs.len() == 1 {
            (left + right) / 2
        } else {
            left + 16 + i * (right - left - 32) / (xs.len() as i64 - 1)
        }
    };
    let mut v = 0.0;
    while v <= ymax + step / 2.0 {
        let y = ypix(v);
        c.line((left, y), (right, y), GRID, 1, false);
        let label = short(v);
        c.text(
            left - 6 - Canvas::text_width(&label, 1),
            y - 4,
            &label,
            AXIS,
            1,
        );
        v += step;
    }
    c.line((left, top), (left, bottom), AXIS, 1, false);
    c.line((left, bottom), (right, bottom), AXIS, 1, false);
    for x in &xs {
        let label = x.to_string();
        let px = xpix(*x);
        c.line((px, bottom), (px, bottom + 4), AXIS, 1, false);
        c.text(
            px - Canvas::text_width(&label, 1) / 2,
            bottom + 8,
            &label,
            AXIS,
            1,
        );
    }
    let axis = "concurrent clients";
    c.text(
        (left + right) / 2 - Canvas::text_width(axis, 1) / 2,
        bottom + 20,
        axis,
        AXIS,
        1,
    );
    for s in &p.series {
        let mut pts: Vec<(usize, f64)> = s.points.clone();
        pts.sort_by_key(|p| p.0);
        for pair in pts.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            c.line(
                (xpix(a.0), ypix(a.1)),
                (xpix(b.0), ypix(b.1)),
                s.color,
                2,
                s.dashed,
            );
        }
        for pt in &pts {
            c.rect(xpix(pt.0) - 3, ypix(pt.1) - 3, 7, 7, s.color);
        }
    }
    // Legend, top left inside the plot.
    let mut ly = top + 6;
    for s in &p.series {
        c.line(
            (left + 8, ly + 4),
            (left + 28, ly + 4),
            s.color,
            2,
            s.dashed,
        );
        c.text(left + 34, ly, &s.label, BLACK, 1);
        ly += 12;
    }
}

/// Renders `panels` in a grid, `cols` wide.
pub fn render(panels: &[Panel], cols: usize, path: &Path) -> Result<()> {
    let (pw, ph) = (400usize, 330usize);
    let cols = cols.max(1).min(panels.len().max(1));
    let rows = panels.len().div_ceil(cols).max(1);
    let mut c = Canvas::new(pw * cols, ph * rows);
    for (i, p) in panels.iter().enumerate() {
        let (cx, cy) = ((i % cols) * pw, (i / cols) * ph);
        draw_panel(&mut c, p, cx as i64, cy as i64, pw as i64, ph as i64);
    }
    c.save(path)
}

fn series_for(
    results: &[RunResult],
    workload: &str,
    targets: &[Target],
    value_size: Option<usize>,
    qos: Option<u8>,
) -> Vec<Series> {
    let mut out = Vec::new();
    for t in targets {
        let points: Vec<(usize, f64)> = results
            .iter()
            .filter(|r| r.workload == workload && r.target == *t && r.failed.is_none())
            .filter(|r| value_size.is_none() || r.value_size == value_size)
            .filter(|r| qos.is_none() || r.qos == qos)
            .map(|r| (r.clients, r.throughput))
            .collect();
        if points.is_empty() {
            continue;
        }
        let label = match qos {
            Some(q) => format!("{} QoS {q}", t.name()),
            None => t.name().to_owned(),
        };
        out.push(Series {
            label,
            color: color(*t),
            dashed: qos == Some(0) || *t == Target::MqkvDisk,
            points,
        });
    }
    out
}

/// The standard chart: state store SET/GET/mix at one value size, SET pipelined on one
/// connection, pub/sub fan-in and fan-out, notification fan-out and connection storms.
pub fn throughput_chart(results: &[RunResult], path: &Path) -> Result<()> {
    let sizes: Vec<usize> = results
        .iter()
        .filter(|r| matches!(r.workload.as_str(), "set" | "get" | "mix"))
        .filter_map(|r| r.value_size)
        .collect();
    let size = if sizes.contains(&1024) {
        Some(1024)
    } else {
        sizes.iter().min().copied()
    };
    let size_label = size.map(fmt_size).unwrap_or_default();
    let kv = [
        Target::Mqkv,
        Target::MqkvDisk,
        Target::Redis,
        Target::RedisAof,
    ];
    let mq = [Target::Mqkv, Target::Mosquitto];
    let mut panels = vec![
        Panel {
            title: format!("state store SET {size_label} (ops/s)"),
            series: series_for(results, "set", &kv, size, None),
        },
        Panel {
            title: format!("state store GET {size_label} (ops/s)"),
            series: series_for(results, "get", &kv, size, None),
        },
        Panel {
            title: format!("90/10 GET/SET {size_label} (ops/s)"),
            series: series_for(results, "mix", &kv, size, None),
        },
        Panel {
            title: "SET 16B, 1 connection, x = in flight (ops/s)".to_owned(),
            series: series_for(results, "set-pipelined", &kv, Some(16), None),
        },
    ];
    for (wl, title) in [
        ("pubsub-fanin", "pub/sub fan-in (msgs/s)"),
        ("pubsub-fanout", "pub/sub fan-out (deliveries/s)"),
    ] {
        let mut series = series_for(results, wl, &mq, None, Some(1));
        series.extend(series_for(results, wl, &mq, None, Some(0)));
        panels.push(Panel {
            title: title.to_owned(),
            series,
        });
    }
    panels.push(Panel {
        title: "key notification fan-out (notif/s)".to_owned(),
        series: series_for(results, "notify", &[Target::Mqkv], None, None),
    });
    panels.push(Panel {
        title: "connection storm (connects/s)".to_owned(),
        series: series_for(results, "conn-storm", &mq, None, None),
    });
    panels.retain(|p| !p.series.is_empty());
    if panels.is_empty() {
        panels.push(Panel {
            title: "no throughput results".to_owned(),
            series: Vec::new(),
        });
    }
    render(&panels, 4, path)
}
