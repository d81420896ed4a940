//! Per-route defaults for the bulk endpoint: which `acks` and which key
//! pointer a topic's `/ingest` requests get when they do not say. Loaded
//! from `rest_routes_file`:
//!
//! ```toml
//! [[route]]
//! topics = "app.codestore.*"   # a glob, as in the principals file
//! acks = "1"                   # all | 1 | 0
//! key = "/repo/id"             # a JSON pointer into each event
//! ```
//!
//! The first route whose pattern matches the topic applies. A request's
//! own `?acks=`, `?key=` and `X-Canopy-Key` win over its route.

use std::path::Path;

use serde::Deserialize;

use crate::auth::glob;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    topics: String,
    pub acks: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    route: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    topics: String,
    acks: Option<String>,
    key: Option<String>,
}

impl Routes {
    pub fn load(path: &Path) -> Result<Routes, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Routes::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Routes, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut routes = Vec::with_capacity(file.route.len());
        for (i, e) in file.route.into_iter().enumerate() {
            if e.topics.is_empty() {
                return Err(format!("route {i} has an empty topics pattern"));
            }
            if let Some(a) = &e.acks {
                if !matches!(a.as_str(), "all" | "-1" | "1" | "0") {
                    return Err(format!("route {i} ({}): acks must be all, 1 or 0, not {a:?}", e.topics));
                }
            }
            if let Some(k) = &e.key {
                if !k.starts_with('/') {
                    return Err(format!("route {i} ({}): key must be a JSON pointer starting with '/', not {k:?}", e.topics));
                }
            }
            routes.push(Route { topics: e.topics, acks: e.acks, key: e.key });
        }
        Ok(Routes { routes })
    }

    /// The route for `topic`, if one is configured.
    pub fn for_topic(&self, topic: &str) -> Option<&Route> {
        self.routes.iter().find(|r| glob(r.topics.as_bytes(), topic.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_wins() {
        let r = Routes::parse(
            r#"
            [[route]]
            topics = "app.codestore.*"
            acks = "1"
            key = "/repo"
            [[route]]
            topics = "app.*"
            acks = "0"
            "#,
        )
        .unwrap();
        let c = r.for_topic("app.codestore.commits").unwrap();
        assert_eq!((c.acks.as_deref(), c.key.as_deref()), (Some("1"), Some("/repo")));
        let a = r.for_topic("app.web").unwrap();
        assert_eq!((a.acks.as_deref(), a.key.as_deref()), (Some("0"), None));
        assert!(r.for_topic("other").is_none());
    }

    #[test]
    fn bad_files_are_refused() {
        for bad in [
            "[[route]]\ntopics = \"\"",
            "[[route]]\ntopics = \"a\"\nacks = \"2\"",
            "[[route]]\ntopics = \"a\"\nkey = \"repo\"",
            "[[route]]\ntopics = \"a\"\nkeys = \"/x\"",
            "[[route]]\nacks = \"1\"",
            "route = 3",
        ] {
            assert!(Routes::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(Routes::parse("").unwrap().for_topic("x").is_none());
    }
}
