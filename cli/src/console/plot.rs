//! Small inline SVG charts, drawn on the server: a line over periods and
//! horizontal bars. No script, nothing fetched.

use super::html::esc;

const W: f64 = 560.0;
const H: f64 = 160.0;
const PAD: f64 = 36.0;

fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000);
    format!("{:02}:{:02}", s.rem_euclid(86_400) / 3600, s.rem_euclid(3600) / 60)
}

/// A line over `(time ms, value)` points, with its axis labels; a note
/// when there is nothing to draw.
pub fn line(title: &str, unit: &str, points: &[(i64, f64)]) -> String {
    let mut out = format!("<figure><figcaption>{}</figcaption>", esc(title));
    if points.is_empty() {
        out.push_str("<p class=muted>no data in this window</p></figure>");
        return out;
    }
    let (t0, t1) = (points[0].0, points[points.len() - 1].0.max(points[0].0 + 1));
    let top = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let x = |t: i64| PAD + (t - t0) as f64 / (t1 - t0) as f64 * (W - 2.0 * PAD);
    let y = |v: f64| H - PAD / 2.0 - v / top * (H - PAD);
    let path: Vec<String> = points.iter().map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v))).collect();
    out.push_str(&format!(
        "<svg role=img aria-label=\"{}\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\">\
         <line x1=\"{PAD}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"#999\"/>\
         <polyline fill=\"none\" stroke=\"#2563eb\" stroke-width=\"2\" points=\"{}\"/>",
        esc(title),
        path.join(" "),
        b = H - PAD / 2.0,
        r = W - PAD,
    ));
    for &(t, v) in points {
        out.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#2563eb\"><title>{} {:.2} {}</title></circle>",
            x(t),
            y(v),
            clock(t),
            v,
            esc(unit)
        ));
    }
    out.push_str(&format!(
        "<text x=\"2\" y=\"{:.1}\" font-size=\"11\">{:.1} {}</text>\
         <text x=\"{PAD}\" y=\"{H}\" font-size=\"11\">{}</text>\
         <text x=\"{:.1}\" y=\"{H}\" font-size=\"11\" text-anchor=\"end\">{}</text></svg></figure>",
        PAD / 2.0,
        top,
        esc(unit),
        clock(t0),
        W - PAD,
        clock(t1)
    ));
    out
}

/// Horizontal bars, largest first.
pub fn bars(title: &str, items: &[(String, u64)]) -> String {
    let mut out = format!("<figure><figcaption>{}</figcaption>", esc(title));
    if items.is_empty() {
        out.push_str("<p class=muted>none</p></figure>");
        return out;
    }
    let top = items.iter().map(|i| i.1).max().unwrap_or(1).max(1) as f64;
    let row = 22.0;
    let h = row * items.len() as f64 + 4.0;
    out.push_str(&format!(
        "<svg role=img aria-label=\"{}\" viewBox=\"0 0 {W} {h}\" width=\"{W}\" height=\"{h}\">",
        esc(title)
    ));
    for (i, (label, n)) in items.iter().enumerate() {
        let y = i as f64 * row + 2.0;
        let w = (*n as f64 / top) * (W - 260.0);
        out.push_str(&format!(
            "<text x=\"0\" y=\"{:.1}\" font-size=\"12\">{}</text>\
             <rect x=\"220\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"16\" fill=\"#dc2626\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{n}</text>",
            y + 13.0,
            esc(label),
            224.0 + w,
            y + 13.0
        ));
    }
    out.push_str("</svg></figure>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_escape_labels_and_say_when_empty() {
        assert!(line("latency", "ms", &[]).contains("no data"));
        let svg = line("latency <b>", "ms", &[(0, 1.0), (60_000, 3.0)]);
        assert!(svg.contains("latency &lt;b&gt;") && !svg.contains("<b>"));
        assert_eq!(svg.matches("<circle").count(), 2);
        let svg = bars("types", &[("stripe <x>".into(), 4), ("github push".into(), 2)]);
        assert!(svg.contains("stripe &lt;x&gt;") && svg.matches("<rect").count() == 2);
        assert!(bars("types", &[]).contains("none"));
    }
}
