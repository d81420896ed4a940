//! The split report: the adaptive plan and the prefix3 baseline for one set
//! of topic volumes, side by side, as text, JSON (the plans themselves) or a
//! self-contained HTML page (inline SVG, no network).
//!
//! The page draws the topic tree as an icicle: depth runs left to right,
//! each node's height is its subtree's bytes (to scale). A topic is coloured
//! by its store; an inner node by its store when every topic under it is in
//! that one store (so a store's region reads as one block of colour), grey
//! when its topics are split over stores.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::split::{self, Budget, Numbers, Plan, Strategy};

/// Both plans for the same topics.
pub struct Report {
    pub budget: Budget,
    pub adaptive: Plan,
    pub prefix3: Plan,
}

impl Report {
    /// Plans `topics` both ways. Without a store budget, the adaptive plan
    /// gets prefix3's store count, so the two are compared at equal files.
    pub fn new(topics: &[(String, u64)], max_stores: Option<usize>, min_store_bytes: u64) -> Report {
        let prefix3 = split::plan(topics, Strategy::Prefix3);
        let budget = Budget { max_stores: Some(max_stores.unwrap_or(prefix3.stores.len().max(1))), min_store_bytes };
        let adaptive = split::plan(topics, Strategy::Adaptive(budget));
        Report { budget, adaptive, prefix3 }
    }

    pub fn text(&self) -> String {
        let (a, p) = (split::numbers(&self.adaptive), split::numbers(&self.prefix3));
        let mut out = String::new();
        let total: u64 = self.adaptive.topics.iter().fold(0u64, |a, t| a.saturating_add(t.1));
        let _ = writeln!(out, "{} topics, {} bytes; adaptive budget: {} stores at most, {} bytes per store at least (threshold {})", self.adaptive.topics.len(), total, self.budget.max_stores.unwrap_or(0), self.budget.min_store_bytes, self.adaptive.threshold);
        let _ = writeln!(out, "{:<34}{:>24}{:>24}", "", "adaptive", "prefix3");
        let row = |out: &mut String, name: &str, a: String, p: String| {
            let _ = writeln!(out, "{name:<34}{a:>24}{p:>24}");
        };
        row(&mut out, "stores", a.stores.to_string(), p.stores.to_string());
        row(&mut out, "wasted bytes, all topics", a.total_wasted.to_string(), p.total_wasted.to_string());
        let waste = |n: &Numbers| n.worst_waste.map_or("-".into(), |(_, w)| w.to_string());
        let waster = |n: &Numbers, plan: &Plan| n.worst_waste.map_or("-".into(), |(t, _)| plan.topics[t].0.clone());
        row(&mut out, "most wasted by one topic", waste(&a), waste(&p));
        row(&mut out, "  that topic", waster(&a, &self.adaptive), waster(&p, &self.prefix3));
        let ratio = |n: &Numbers| n.worst_ratio.map_or("-".into(), |(_, r)| format!("{r:.2}"));
        let ratio_t = |n: &Numbers, plan: &Plan| n.worst_ratio.map_or("-".into(), |(t, _)| plan.topics[t].0.clone());
        row(&mut out, "worst read / useful bytes", ratio(&a), ratio(&p));
        row(&mut out, "  that topic", ratio_t(&a, &self.adaptive), ratio_t(&p, &self.prefix3));
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let plan_json = |plan: &Plan| {
            let n = split::numbers(plan);
            serde_json::json!({
                "threshold": plan.threshold,
                "numbers": {
                    "stores": n.stores,
                    "total_wasted_bytes": n.total_wasted,
                    "worst_waste": n.worst_waste.map(|(t, w)| serde_json::json!({"topic": plan.topics[t].0, "wasted_bytes": w})),
                    "worst_ratio": n.worst_ratio.map(|(t, r)| serde_json::json!({"topic": plan.topics[t].0, "ratio": r})),
                },
                "stores": plan.stores.iter().enumerate().map(|(i, s)| serde_json::json!({
                    "store": i, "label": s.label, "root": s.root, "bytes": s.bytes,
                    "topics": s.topics.iter().map(|&t| plan.topics[t].0.as_str()).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "topic_store": plan.topics.iter().enumerate().map(|(t, (name, _))| (name.clone(), serde_json::json!(plan.store_of[t]))).collect::<serde_json::Map<_, _>>(),
            })
        };
        serde_json::json!({
            "topics": self.adaptive.topics.len(),
            "bytes": self.adaptive.topics.iter().fold(0u64, |a, t| a.saturating_add(t.1)),
            "budget": {"max_stores": self.budget.max_stores, "min_store_bytes": self.budget.min_store_bytes},
            "adaptive": plan_json(&self.adaptive),
            "prefix3": plan_json(&self.prefix3),
        })
    }

    /// A self-contained page: the numbers, then both plans drawn.
    pub fn html(&self, title: &str) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
             body{{font:14px sans-serif;margin:20px;color:#222}}pre{{background:#f6f6f6;padding:10px}}\
             .plans{{display:flex;gap:24px;flex-wrap:wrap}}h2{{font-size:16px}}table{{border-collapse:collapse}}\
             td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}}td:first-child,th:first-child{{text-align:left}}\
             </style></head><body><h1>{t}</h1><pre>{n}</pre>\
             <p>Each column is one depth of the topic tree; each box's height is the bytes under that node, to scale. \
             Topics take their store's colour; an inner node takes it when all its topics share one store, and is grey \
             when they are split. Hover for names, bytes and stores.</p><div class=\"plans\">",
            t = esc(title),
            n = esc(&self.text())
        );
        for (name, plan) in [("adaptive", &self.adaptive), ("prefix3", &self.prefix3)] {
            let _ = write!(out, "<div><h2>{name}: {} stores</h2>{}{}</div>", plan.stores.len(), svg(plan), store_table(plan));
        }
        out.push_str("</div></body></html>\n");
        out
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A colour per store, spread around the hue circle.
fn colour(store: usize) -> String {
    let hue = (store as f64 * 137.508) % 360.0;
    let light = 45 + (store % 3) * 10;
    format!("hsl({hue:.0},65%,{light}%)")
}

/// A node of the drawn tree.
#[derive(Default)]
struct Node {
    bytes: u64,
    /// The one store of every topic below, if there is one.
    store: Option<Option<usize>>,
    topic: Option<usize>,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn add(&mut self, store: usize) {
        self.store = Some(match self.store {
            None => Some(store),
            Some(Some(s)) if s == store => Some(s),
            Some(_) => None,
        });
    }
}

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 720.0;
/// Boxes thinner than this are not drawn (their parent's box still is).
const MIN_PX: f64 = 0.6;

fn svg(plan: &Plan) -> String {
    let mut root = Node::default();
    let mut depth = 1;
    for (t, (name, bytes)) in plan.topics.iter().enumerate() {
        let store = plan.store_of[t];
        let mut at = &mut root;
        at.bytes = at.bytes.saturating_add(*bytes);
        at.add(store);
        let segs: Vec<&str> = name.split('.').collect();
        depth = depth.max(segs.len());
        for seg in segs {
            at = at.children.entry(seg.to_owned()).or_default();
            at.bytes = at.bytes.saturating_add(*bytes);
            at.add(store);
        }
        at.topic = Some(t);
    }
    let col = WIDTH / depth as f64;
    let scale = if root.bytes == 0 { 0.0 } else { HEIGHT / root.bytes as f64 };
    let mut out = String::new();
    let _ = write!(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\">");
    // Iterative (trees can be deep). Children are laid out top to bottom
    // in name order: pushed reversed, each with its top.
    let mut stack: Vec<(&Node, String, usize, f64)> = Vec::new();
    fn push_children<'a>(stack: &mut Vec<(&'a Node, String, usize, f64)>, node: &'a Node, name: &str, d: usize, y: f64, scale: f64) {
        let mut cy = y;
        let mut kids = Vec::with_capacity(node.children.len());
        for (k, c) in &node.children {
            kids.push((c, if name.is_empty() { k.clone() } else { format!("{name}.{k}") }, d, cy));
            cy += c.bytes as f64 * scale;
        }
        stack.extend(kids.into_iter().rev());
    }
    push_children(&mut stack, &root, "", 0, 0.0, scale);
    while let Some((node, name, d, y)) = stack.pop() {
        let h = node.bytes as f64 * scale;
        if h < MIN_PX {
            continue;
        }
        let fill = match (node.topic, node.store) {
            (_, Some(Some(s))) => colour(s),
            _ => "#bbbbbb".to_owned(),
        };
        let stores = match node.store {
            Some(Some(s)) => plan.stores[s].label.clone(),
            _ => "several stores".to_owned(),
        };
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.2}\" width=\"{:.1}\" height=\"{:.2}\" fill=\"{fill}\" stroke=\"#fff\" stroke-width=\"0.5\"><title>{} — {} bytes — {}</title></rect>",
            d as f64 * col,
            y,
            col,
            h,
            esc(&name),
            node.bytes,
            esc(&stores)
        );
        if h >= 11.0 && col >= 40.0 {
            let label: String = name.rsplit('.').next().unwrap_or("").chars().take((col / 7.0) as usize).collect();
            let _ = write!(out, "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#fff\">{}</text>", d as f64 * col + 2.0, y + 10.0, esc(&label));
        }
        push_children(&mut stack, node, &name, d + 1, y, scale);
    }
    out.push_str("</svg>");
    out
}

/// The largest stores of a plan, with their colours.
fn store_table(plan: &Plan) -> String {
    let mut order: Vec<usize> = (0..plan.stores.len()).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(plan.stores[s].bytes));
    let mut out = String::from("<table><tr><th>store</th><th>bytes</th><th>topics</th></tr>");
    for &s in order.iter().take(30) {
        let st = &plan.stores[s];
        let _ = write!(out, "<tr><td><span style=\"color:{}\">■</span> {}</td><td>{}</td><td>{}</td></tr>", colour(s), esc(&st.label), st.bytes, st.topics.len());
    }
    if order.len() > 30 {
        let _ = write!(out, "<tr><td>… {} more</td><td></td><td></td></tr>", order.len() - 30);
    }
    out.push_str("</table>");
    out
}

/// Parses `topic,bytes` lines (a header line and blank lines are skipped).
pub fn parse_csv(text: &str) -> Result<Vec<(String, u64)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((topic, bytes)) = line.rsplit_once(',') else { return Err(format!("line {}: expected topic,bytes", i + 1)) };
        let (topic, bytes) = (topic.trim(), bytes.trim());
        match bytes.parse::<u64>() {
            Ok(b) if !topic.is_empty() => out.push((topic.to_owned(), b)),
            // A header line: its second field is no number at all.
            Err(_) if i == 0 && bytes.parse::<f64>().is_err() => continue,
            _ => return Err(format!("line {}: {line:?} is not topic,bytes", i + 1)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(String, u64)> {
        parse_csv("topic,bytes\napp.codestore.commits,2720000000\napp.codestore.reviews,10000000\napp.codestore.tags,28500000\nlog.a.b.c,5\nlog.a.b.d,7\n").unwrap()
    }

    #[test]
    fn csv_parsing_refuses_bad_lines_by_number() {
        assert_eq!(sample().len(), 5);
        assert!(parse_csv("a,1\nb\n").unwrap_err().starts_with("line 2"));
        assert!(parse_csv("a,1\nb,x\n").unwrap_err().starts_with("line 2"));
        assert!(parse_csv("a,1\n,5\n").is_err());
        assert!(parse_csv("a,-1\n").is_err());
        assert_eq!(parse_csv("").unwrap(), vec![]);
        // Sizes that overflow a sum saturate rather than panic.
        let huge = parse_csv("a.x,18446744073709551615\na.y,18446744073709551615\na.x,5\n").unwrap();
        let r = Report::new(&huge, Some(1), 0);
        assert_eq!(r.adaptive.stores.len(), 1);
        assert!(r.html("huge").contains("<svg"));
    }

    #[test]
    fn report_formats_agree_with_the_numbers() {
        let r = Report::new(&sample(), None, 0);
        assert!(r.adaptive.stores.len() <= r.prefix3.stores.len());
        let text = r.text();
        assert!(text.contains("adaptive") && text.contains("prefix3"), "{text}");
        let j = r.json();
        assert_eq!(j["adaptive"]["numbers"]["total_wasted_bytes"].as_u64().unwrap(), split::numbers(&r.adaptive).total_wasted);
        assert_eq!(j["prefix3"]["topic_store"].as_object().unwrap().len(), 5);
        let html = r.html("t <&>");
        assert!(html.contains("<svg") && html.contains("t &lt;&amp;&gt;"));
        // Self-contained: no scripts, no fetches; the only URLs are the two
        // SVG namespace names.
        assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href"));
        assert_eq!(html.matches("http").count(), 2);
        // Every store of both plans appears with its colour in a table.
        assert!(html.matches("<rect").count() >= 5);
    }

    #[test]
    fn big_and_deep_trees_render() {
        let flat: Vec<(String, u64)> = (0..20_000).map(|i| (format!("t.{i}"), 1 + i as u64 % 100)).collect();
        let r = Report::new(&flat, Some(50), 0);
        assert!(r.html("flat").len() < 8 << 20);
        let chain: Vec<(String, u64)> = (1..=30).map(|d| ((0..d).map(|i| format!("l{i}")).collect::<Vec<_>>().join("."), 100)).collect();
        let r = Report::new(&chain, Some(4), 0);
        assert!(r.html("chain").contains("<rect"));
    }
}
