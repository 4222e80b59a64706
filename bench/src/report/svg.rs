//! The SVG chart of a run: NDR (Kpps) against frame size, one panel per family, one line per
//! row.

use std::fmt::Write as _;

use super::Report;
use crate::packet::Family;

impl Report {
    /// SVG line chart: NDR (Kpps) against frame size, one panel per family, one line per row.
    pub fn svg(&self) -> String {
        const COLORS: [&str; 8] = [
            "#444444", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
        ];
        let families: Vec<Family> = [Family::Ipv4, Family::Ipv6]
            .into_iter()
            .filter(|f| !self.sizes(*f).is_empty())
            .collect();
        let rows = self.rows();
        let (pw, ph, left, top) = (520.0, 300.0, 70.0, 40.0);
        let width = left + (pw + 40.0) * families.len().max(1) as f64 + 240.0;
        let height = top + ph + 70.0;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
             fill=\"white\"/>"
        );
        for (fi, family) in families.iter().enumerate() {
            let sizes = self.sizes(*family);
            let x0 = left + fi as f64 * (pw + 40.0);
            let ymax = self
                .throughput
                .iter()
                .filter(|c| c.family == *family)
                .map(|c| c.ndr_pps / 1e3)
                .fold(1.0f64, f64::max)
                * 1.1;
            let x = |i: usize| x0 + pw * (i as f64 + 0.5) / sizes.len() as f64;
            let y = |k: f64| top + ph - ph * k / ymax;
            let _ = writeln!(
                o,
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\" font-size=\"14\">{} NDR \
                 (Kpps) vs frame size (B)</text>",
                x0 + pw / 2.0,
                top - 15.0,
                family.name()
            );
            let _ = writeln!(
                o,
                "<rect x=\"{x0:.0}\" y=\"{top:.0}\" width=\"{pw:.0}\" height=\"{ph:.0}\" \
                 fill=\"none\" stroke=\"#999\"/>"
            );
            for t in 0..=4 {
                let k = ymax * f64::from(t) / 4.0;
                let _ = writeln!(
                    o,
                    "<line x1=\"{x0:.0}\" x2=\"{:.0}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" \
                     stroke=\"#eee\"/><text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{k:.0}\
                     </text>",
                    x0 + pw,
                    x0 - 5.0,
                    y(k) + 4.0,
                    yy = y(k)
                );
            }
            for (i, s) in sizes.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "<text x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">{s}</text>",
                    x(i),
                    top + ph + 18.0
                );
            }
            for (ri, row) in rows.iter().enumerate() {
                let pts: Vec<String> = sizes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        self.cell(row, *family, *s)
                            .map(|c| format!("{:.1},{:.1}", x(i), y(c.ndr_pps / 1e3)))
                    })
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                let color = COLORS[ri % COLORS.len()];
                let _ = writeln!(
                    o,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                    pts.join(" ")
                );
                for p in &pts {
                    let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
                    let _ = writeln!(
                        o,
                        "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{color}\"/>"
                    );
                }
            }
        }
        let lx = left + (pw + 40.0) * families.len().max(1) as f64;
        for (ri, row) in rows.iter().enumerate() {
            let color = COLORS[ri % COLORS.len()];
            let ly = top + 10.0 + 20.0 * ri as f64;
            let _ = writeln!(
                o,
                "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"14\" height=\"4\" fill=\"{color}\"/>\
                 <text x=\"{:.0}\" y=\"{:.0}\">{}</text>",
                ly - 4.0,
                lx + 20.0,
                ly + 2.0,
                xml_escape(row)
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
