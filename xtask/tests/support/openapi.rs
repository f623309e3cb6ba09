//! Checks HTTP requests and responses against an OpenAPI 3.0 description: the operation exists,
//! required query parameters are there, JSON bodies match their schemas, response statuses are
//! declared. Schemas use the subset GitHub's description uses: `$ref`, `type`, `nullable`,
//! `properties`, `required`, `items`, `enum`, `oneOf`, `minLength`/`maxLength`, `format`.

use serde_json::Value;

pub struct Spec {
    doc: Value,
}

/// An operation matched from a method and a path.
pub struct Operation<'a> {
    pub template: String,
    pub id: String,
    op: &'a Value,
    path_item: &'a Value,
}

impl Spec {
    pub fn load(path: &str) -> Spec {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        Spec {
            doc: serde_json::from_str(&text).unwrap(),
        }
    }

    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        let mut v = v;
        while let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let mut cur = &self.doc;
            for part in r.trim_start_matches("#/").split('/') {
                cur = &cur[part];
            }
            v = cur;
        }
        v
    }

    /// The operation for `method` and `path` (no query), preferring templates with more
    /// literal segments. A final `{ref}` may span several segments (`x-multi-segment`).
    pub fn operation(&self, method: &str, path: &str) -> Result<Operation<'_>, String> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut best: Option<(usize, &String, &Value)> = None;
        for (template, item) in self.doc["paths"].as_object().unwrap() {
            let t: Vec<&str> = template.trim_matches('/').split('/').collect();
            let multi = t.last().is_some_and(|l| {
                l.starts_with('{') && self.multi_segment(item, l.trim_matches(['{', '}']))
            });
            let fits = t.len() == segs.len() || (multi && segs.len() > t.len());
            if !fits {
                continue;
            }
            let mut literal = 0;
            let ok = t.iter().zip(&segs).all(|(a, b)| {
                if a.starts_with('{') {
                    !b.is_empty()
                } else {
                    literal += 1;
                    a == b
                }
            });
            if ok && best.is_none_or(|(l, _, _)| literal > l) {
                best = Some((literal, template, item));
            }
        }
        let (_, template, item) =
            best.ok_or_else(|| format!("{method} {path}: no such path in the description"))?;
        let op = item
            .get(method.to_ascii_lowercase())
            .ok_or_else(|| format!("{method} {path}: {template} has no {method} operation"))?;
        Ok(Operation {
            template: template.clone(),
            id: op["operationId"].as_str().unwrap_or("?").to_owned(),
            op,
            path_item: item,
        })
    }

    /// Whether path parameter `name` of a path item is marked `x-multi-segment`.
    fn multi_segment(&self, item: &Value, name: &str) -> bool {
        item.as_object()
            .unwrap()
            .values()
            .filter_map(|op| op.get("parameters")?.as_array())
            .flatten()
            .any(|p| {
                let p = self.resolve(p);
                p["name"] == name && p["x-multi-segment"] == true
            })
    }

    /// Problems with a request to `op`.
    pub fn check_request(
        &self,
        op: &Operation<'_>,
        query: &[(String, String)],
        content_type: Option<&str>,
        body: &[u8],
    ) -> Vec<String> {
        let mut out = Vec::new();
        let params = op
            .path_item
            .get("parameters")
            .into_iter()
            .chain(op.op.get("parameters"))
            .flat_map(|p| p.as_array().unwrap());
        for p in params {
            let p = self.resolve(p);
            if p["in"] == "query" {
                let name = p["name"].as_str().unwrap();
                match query.iter().find(|(k, _)| k == name) {
                    None if p["required"] == true => out.push(format!(
                        "{}: required query parameter `{name}` missing",
                        op.id
                    )),
                    Some((_, v))
                        if p["schema"]["type"] == "integer" && v.parse::<i64>().is_err() =>
                    {
                        out.push(format!(
                            "{}: query parameter `{name}` = {v:?} is not an integer",
                            op.id
                        ))
                    }
                    _ => {}
                }
            }
        }
        if let Some(rb) = op.op.get("requestBody") {
            let rb = self.resolve(rb);
            if let Some(schema) = rb["content"].get("application/json").map(|c| &c["schema"]) {
                if body.is_empty() {
                    if rb["required"] == true {
                        out.push(format!("{}: JSON body required", op.id));
                    }
                } else {
                    match serde_json::from_slice::<Value>(body) {
                        Ok(v) => {
                            out.extend(self.validate(&v, schema, &format!("{} request", op.id)))
                        }
                        Err(e) => out.push(format!("{}: request body is not JSON: {e}", op.id)),
                    }
                }
            } else if rb["content"].get("application/octet-stream").is_some()
                && content_type.is_none()
            {
                out.push(format!("{}: Content-Type header required", op.id));
            }
        }
        out
    }

    /// Problems with a response of `op`. 5xx statuses are never declared by GitHub's description
    /// (the upload operation documents its 502 in prose), so they are not flagged.
    pub fn check_response(&self, op: &Operation<'_>, status: u16, body: &[u8]) -> Vec<String> {
        if status >= 500 {
            return Vec::new();
        }
        let responses = &op.op["responses"];
        let Some(resp) = responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))
        else {
            return vec![format!("{}: status {status} is not declared", op.id)];
        };
        let resp = self.resolve(resp);
        match resp["content"]
            .get("application/json")
            .map(|c| &c["schema"])
        {
            Some(schema) => match serde_json::from_slice::<Value>(body) {
                Ok(v) => self.validate(&v, schema, &format!("{} {status} response", op.id)),
                Err(e) => vec![format!("{}: {status} response is not JSON: {e}", op.id)],
            },
            None => Vec::new(),
        }
    }

    /// JSON Schema (OpenAPI 3.0 subset) validation; each problem names its JSON path.
    pub fn validate(&self, v: &Value, schema: &Value, at: &str) -> Vec<String> {
        let s = self.resolve(schema);
        if v.is_null() {
            return if s["nullable"] == true || s.get("type").is_none() && s.get("oneOf").is_none() {
                Vec::new()
            } else {
                vec![format!("{at}: null but not nullable")]
            };
        }
        if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
            if !alts.iter().any(|alt| self.validate(v, alt, at).is_empty()) {
                return vec![format!("{at}: matches none of oneOf")];
            }
        }
        let mut out = Vec::new();
        if let Some(values) = s.get("enum").and_then(Value::as_array) {
            if !values.contains(v) {
                out.push(format!("{at}: {v} not in enum {values:?}"));
            }
        }
        let ty = s.get("type").and_then(Value::as_str);
        let type_ok = match ty {
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            _ => true,
        };
        if !type_ok {
            out.push(format!("{at}: {v} is not of type {}", ty.unwrap_or("?")));
            return out;
        }
        if let Some(text) = v.as_str() {
            let n = text.chars().count() as u64;
            if s.get("minLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n < m)
            {
                out.push(format!("{at}: shorter than minLength"));
            }
            if s.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
            {
                out.push(format!("{at}: longer than maxLength"));
            }
            match s.get("format").and_then(Value::as_str) {
                Some("uri") if !text.contains("://") => {
                    out.push(format!("{at}: {text:?} is not a URI"))
                }
                Some("date-time") if !is_date_time(text) => {
                    out.push(format!("{at}: {text:?} is not a date-time"))
                }
                _ => {}
            }
        }
        if let Some(obj) = v.as_object() {
            for r in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let r = r.as_str().unwrap();
                if !obj.contains_key(r) {
                    out.push(format!("{at}: required property `{r}` missing"));
                }
            }
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, val) in obj {
                    if let Some(ps) = props.get(k) {
                        out.extend(self.validate(val, ps, &format!("{at}.{k}")));
                    }
                }
            }
        }
        if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
            for (i, item) in arr.iter().enumerate() {
                out.extend(self.validate(item, items, &format!("{at}[{i}]")));
            }
        }
        out
    }
}

fn is_date_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':'
}
