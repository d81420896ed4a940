//! Kafka's `ssl.principal.mapping.rules` (KIP-371): how a client
//! certificate's distinguished name becomes a principal name.
//!
//! ```text
//! RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),O=(.*?)$/$1@$2/L,DEFAULT
//! ```
//!
//! Rules are tried in order; the first whose pattern matches the whole
//! name replaces it (`$1` names a group; a trailing `L` or `U` changes the
//! case of the result), and `DEFAULT` keeps the name as it is. A name no
//! rule matches is refused, as in Kafka.

use regex::Regex;

#[derive(Debug)]
enum Rule {
    Default,
    Map { pattern: Regex, replacement: String, case: Option<bool> },
}

#[derive(Debug)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

impl Default for PrincipalMapper {
    fn default() -> PrincipalMapper {
        PrincipalMapper { rules: vec![Rule::Default] }
    }
}

impl PrincipalMapper {
    /// Parses the rules; commas inside a rule's pattern are kept (a comma
    /// separates rules only before `RULE:` or `DEFAULT`).
    pub fn parse(spec: &str) -> Result<PrincipalMapper, String> {
        let mut items: Vec<String> = Vec::new();
        for piece in spec.split(',') {
            let t = piece.trim_start();
            match items.last_mut() {
                Some(last) if !(t.starts_with("RULE:") || t.trim() == "DEFAULT") => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ => items.push(t.to_owned()),
            }
        }
        let mut rules = Vec::new();
        for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
            if item == "DEFAULT" {
                rules.push(Rule::Default);
                continue;
            }
            let body = item.strip_prefix("RULE:").ok_or_else(|| format!("{item:?} is neither RULE:pattern/replacement/[LU] nor DEFAULT"))?;
            let parts = split_unescaped(body);
            let (pattern, replacement, flags) = match parts.as_slice() {
                [p, r, f] => (p.as_str(), r.as_str(), f.as_str()),
                _ => return Err(format!("{item:?} is not RULE:pattern/replacement/[LU]")),
            };
            let case = match flags.trim() {
                "" => None,
                "L" => Some(false),
                "U" => Some(true),
                other => return Err(format!("{item:?}: unknown flag {other:?} (L or U)")),
            };
            let pattern = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| format!("{item:?}: {e}"))?;
            rules.push(Rule::Map { replacement: java_replacement(replacement, pattern.captures_len() - 1), pattern, case });
        }
        if rules.is_empty() {
            return Err("no rules (DEFAULT keeps the certificate's name)".into());
        }
        Ok(PrincipalMapper { rules })
    }

    /// The principal name for `dn`; `None` if no rule matches.
    pub fn map(&self, dn: &str) -> Option<String> {
        for rule in &self.rules {
            match rule {
                Rule::Default => return Some(dn.to_owned()),
                Rule::Map { pattern, replacement, case } => {
                    if !pattern.is_match(dn) {
                        continue;
                    }
                    let out = pattern.replace(dn, replacement.as_str()).into_owned();
                    return Some(match case {
                        Some(true) => out.to_uppercase(),
                        Some(false) => out.to_lowercase(),
                        None => out,
                    });
                }
            }
        }
        None
    }
}

/// Splits a rule's body at `/` not escaped by a backslash.
fn split_unescaped(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let cur = out.last_mut().expect("one part");
                match chars.next() {
                    // An escaped slash is a slash (the regex needs no escape).
                    Some('/') => cur.push('/'),
                    Some(n) => {
                        cur.push('\\');
                        cur.push(n);
                    }
                    None => cur.push('\\'),
                }
            }
            '/' => out.push(String::new()),
            c => out.last_mut().expect("one part").push(c),
        }
    }
    out
}

/// Java's replacement syntax (`$1`, `\$`) as the regex crate's (`${1}`,
/// `$$`): Java reads a group number's digits while they name a group.
fn java_replacement(r: &str, groups: usize) -> String {
    let mut out = String::new();
    let mut chars = r.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(n) => out.push(n),
                None => {}
            },
            '$' => {
                let mut n = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    let mut longer = n.clone();
                    longer.push(*d);
                    if !n.is_empty() && longer.parse::<usize>().map_or(true, |g| g > groups) {
                        break;
                    }
                    n = longer;
                    chars.next();
                }
                if n.is_empty() {
                    out.push_str("$$");
                } else {
                    out.push_str(&format!("${{{n}}}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafkas_examples_map_as_documented() {
        let m = PrincipalMapper::parse(r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,DEFAULT").unwrap();
        assert_eq!(m.map("CN=kafka-svc,OU=ServiceUsers,O=Unknown").as_deref(), Some("kafka-svc"));
        assert_eq!(m.map("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Santa Clara,ST=CA,C=US").as_deref(), Some("duke@javasoft"));
        assert_eq!(m.map("OU=x,cn=writer.one,O=y").as_deref(), Some("WRITER.ONE"));
        assert_eq!(m.map("O=only").as_deref(), Some("O=only"), "DEFAULT keeps the name");
    }

    #[test]
    fn a_name_no_rule_matches_is_refused_and_bad_rules_are_errors() {
        let m = PrincipalMapper::parse(r"RULE:^CN=([^,]*),O=canopy$/$1/").unwrap();
        assert_eq!(m.map("CN=writer,O=canopy").as_deref(), Some("writer"));
        assert_eq!(m.map("CN=writer,O=other"), None, "no DEFAULT: refused");
        assert_eq!(PrincipalMapper::default().map("CN=x").as_deref(), Some("CN=x"));
        for bad in ["", "RULE:x", "RULE:(/x/", "RULE:x/y/Q", "NOPE"] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn java_replacements_become_the_regex_crates() {
        assert_eq!(java_replacement("$1@$2", 2), "${1}@${2}");
        assert_eq!(java_replacement("$12", 1), "${1}2", "a digit past the last group is literal");
        assert_eq!(java_replacement("$12", 12), "${12}");
        assert_eq!(java_replacement(r"\$1x_$1_y", 1), "$$1x_${1}_y");
        let m = PrincipalMapper::parse(r"RULE:^CN=(a)(b)$/$2_$1\/x/").unwrap();
        assert_eq!(m.map("CN=ab").as_deref(), Some("b_a/x"));
    }
}
