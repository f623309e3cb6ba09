//! A GitHub Releases stand-in on loopback. It keeps releases, assets and tags in memory, and
//! checks every request it receives and every response it sends against GitHub's own OpenAPI
//! description (`shared/fixtures/github-releases-openapi.json`); tests assert that no check
//! failed. Faults (a 502 on the next upload, leaving an `open` asset behind as GitHub can) are
//! injected per test.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::openapi::Spec;

/// GitHub's OpenAPI description of the releases API (a copy of the project's shared fixture,
/// kept in the repository so a clean checkout tests against it).
pub const OPENAPI: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/github-releases-openapi.json"
);

#[derive(Clone)]
pub struct StandinAsset {
    pub id: u64,
    pub name: String,
    pub bytes: Vec<u8>,
    pub state: &'static str,
}

#[derive(Clone)]
pub struct StandinRelease {
    pub id: u64,
    pub tag: String,
    pub draft: bool,
    pub immutable: bool,
    pub commitish: String,
    pub assets: Vec<StandinAsset>,
}

pub enum TagTarget {
    Commit(String),
    /// An annotated tag: tag object sha, commit sha.
    Annotated(String, String),
}

/// A fault for the next request matching `method` and whose path contains `path_part`.
pub struct Fault {
    pub method: &'static str,
    pub path_part: &'static str,
    pub status: u16,
    /// For an upload: keep an `open` asset of that name, as a failed upload may.
    pub leave_open_asset: bool,
}

#[derive(Default)]
pub struct State {
    pub releases: Vec<StandinRelease>,
    pub tags: HashMap<String, TagTarget>,
    pub faults: Vec<Fault>,
    /// `METHOD path?query -> status`, in order.
    pub log: Vec<String>,
    /// Everything that did not match the OpenAPI description.
    pub violations: Vec<String>,
    /// Authorization headers seen (to check the token is sent).
    pub auth: Vec<String>,
    next_id: u64,
}

pub struct GitHubStandin {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl GitHubStandin {
    pub fn start() -> GitHubStandin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            next_id: 100,
            ..State::default()
        }));
        let spec = Arc::new(Spec::load(OPENAPI));
        let (st, base) = (state.clone(), url.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (st, spec, base) = (st.clone(), spec.clone(), base.clone());
                std::thread::spawn(move || serve(stream, &st, &spec, &base));
            }
        });
        GitHubStandin { url, state }
    }

    pub fn tag(&self, tag: &str, target: TagTarget) {
        self.state
            .lock()
            .unwrap()
            .tags
            .insert(tag.to_owned(), target);
    }

    pub fn add_release(&self, tag: &str, draft: bool, assets: &[(&str, &[u8])]) -> u64 {
        let mut s = self.state.lock().unwrap();
        let id = s.fresh_id();
        let assets = assets
            .iter()
            .map(|(n, b)| StandinAsset {
                id: s.fresh_id(),
                name: (*n).to_owned(),
                bytes: b.to_vec(),
                state: "uploaded",
            })
            .collect();
        s.releases.push(StandinRelease {
            id,
            tag: tag.to_owned(),
            draft,
            immutable: false,
            commitish: "main".into(),
            assets,
        });
        id
    }

    /// Replaces the bytes of an asset of `tag`'s release, or (`None`) removes it.
    pub fn tamper(&self, tag: &str, name: &str, bytes: Option<&[u8]>) {
        let mut s = self.state.lock().unwrap();
        let r = s.releases.iter_mut().find(|r| r.tag == tag).unwrap();
        match bytes {
            Some(b) => {
                if let Some(a) = r.assets.iter_mut().find(|a| a.name == name) {
                    a.bytes = b.to_vec();
                } else {
                    let id = 9000 + r.assets.len() as u64;
                    r.assets.push(StandinAsset {
                        id,
                        name: name.to_owned(),
                        bytes: b.to_vec(),
                        state: "uploaded",
                    });
                }
            }
            None => r.assets.retain(|a| a.name != name),
        }
    }

    pub fn fault(&self, fault: Fault) {
        self.state.lock().unwrap().faults.push(fault);
    }

    pub fn release(&self, tag: &str) -> Option<StandinRelease> {
        self.state
            .lock()
            .unwrap()
            .releases
            .iter()
            .find(|r| r.tag == tag)
            .cloned()
    }

    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    #[track_caller]
    pub fn assert_no_violations(&self) {
        let s = self.state.lock().unwrap();
        assert!(
            s.violations.is_empty(),
            "OpenAPI violations:\n{}\nlog:\n{}",
            s.violations.join("\n"),
            s.log.join("\n")
        );
    }
}

impl State {
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

pub struct Request {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

pub fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let query = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Some(Request {
        method,
        path: path.to_owned(),
        query,
        headers,
        body,
    })
}

fn serve(mut stream: TcpStream, state: &Mutex<State>, spec: &Spec, base: &str) {
    let Some(req) = read_request(&stream) else {
        return;
    };
    let mut s = state.lock().unwrap();
    if let Some(a) = req.headers.get("authorization") {
        s.auth.push(a.clone());
    }
    if let Some(bytes) = download(&mut s, &req) {
        drop(s);
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            if bytes.is_some() { 200 } else { 404 },
            bytes.as_ref().map_or(0, Vec::len)
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(&bytes.unwrap_or_default());
        return;
    }
    let op = spec.operation(&req.method, &req.path);
    match &op {
        Ok(op) => {
            let v = spec.check_request(
                op,
                &req.query,
                req.headers.get("content-type").map(String::as_str),
                &req.body,
            );
            s.violations.extend(v);
        }
        Err(e) => s.violations.push(e.clone()),
    }
    let (status, body) = handle(&mut s, &req, base);
    if let Ok(op) = &op {
        let v = spec.check_response(op, status, body.as_deref().unwrap_or_default());
        s.violations.extend(v);
    }
    let q: Vec<String> = req.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    s.log.push(format!(
        "{} {}{}{} -> {status}",
        req.method,
        req.path,
        if q.is_empty() { "" } else { "?" },
        q.join("&")
    ));
    drop(s);
    let body = body.unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}

/// `GET /<owner>/<repo>/releases/download/<tag>/<name>`, the public download of an asset
/// (not part of the REST API, so not checked against its description): `Some(None)` is a 404,
/// as github.com answers for a draft's asset without a login.
fn download(s: &mut State, req: &Request) -> Option<Option<Vec<u8>>> {
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let [_, _, "releases", "download", tag, name] = segs[..] else {
        return None;
    };
    if req.method != "GET" {
        return None;
    }
    let bytes = s
        .releases
        .iter()
        .filter(|r| r.tag == tag && !r.draft)
        .flat_map(|r| &r.assets)
        .find(|a| a.name == name && a.state == "uploaded")
        .map(|a| a.bytes.clone());
    s.log.push(format!(
        "GET {} -> {}",
        req.path,
        if bytes.is_some() { 200 } else { 404 }
    ));
    Some(bytes)
}

/// A loopback server answering every request with `handler`; returns its base URL.
pub fn serve_fn(handler: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let Some(req) = read_request(&stream) else {
                continue;
            };
            let (status, body) = handler(&req);
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
    });
    url
}

fn error(status: u16, message: &str) -> (u16, Option<Vec<u8>>) {
    let body = json!({"message": message, "documentation_url": "https://docs.github.com/rest"});
    (status, Some(body.to_string().into_bytes()))
}

fn ok(status: u16, v: Value) -> (u16, Option<Vec<u8>>) {
    (status, Some(v.to_string().into_bytes()))
}

fn handle(s: &mut State, req: &Request, base: &str) -> (u16, Option<Vec<u8>>) {
    if let Some(i) = s
        .faults
        .iter()
        .position(|f| f.method == req.method && req.path.contains(f.path_part))
    {
        let f = s.faults.remove(i);
        if f.leave_open_asset {
            let name = req
                .query
                .iter()
                .find(|(k, _)| k == "name")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let id = s.fresh_id();
            if let Some(r) = release_of_path(s, &req.path) {
                r.assets.push(StandinAsset {
                    id,
                    name,
                    bytes: Vec::new(),
                    state: "open",
                });
            }
        }
        return error(f.status, "Bad Gateway");
    }
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let (owner, repo) = (
        segs.get(1).copied().unwrap_or(""),
        segs.get(2).copied().unwrap_or(""),
    );
    let rest = &segs[3.min(segs.len())..];
    let repo_url = format!("{base}/repos/{owner}/{repo}");
    match (req.method.as_str(), rest) {
        ("GET", ["git", "ref", "tags", tag]) => match s.tags.get(*tag) {
            Some(TagTarget::Commit(sha)) => ok(200, git_ref(&repo_url, tag, "commit", sha)),
            Some(TagTarget::Annotated(obj, _)) => ok(200, git_ref(&repo_url, tag, "tag", obj)),
            None => error(404, "Not Found"),
        },
        ("GET", ["git", "tags", sha]) => {
            let found = s.tags.iter().find_map(|(t, tt)| match tt {
                TagTarget::Annotated(o, c) if o == sha => Some((t.clone(), c.clone())),
                _ => None,
            });
            match found {
                Some((tag, commit)) => ok(
                    200,
                    json!({
                        "node_id": "TAG", "tag": tag, "sha": sha, "url": format!("{repo_url}/git/tags/{sha}"),
                        "message": tag, "tagger": {"date": "2023-11-14T22:13:20Z", "email": "r@test.invalid", "name": "r"},
                        "object": {"sha": commit, "type": "commit", "url": format!("{repo_url}/git/commits/{commit}")},
                    }),
                ),
                None => error(404, "Not Found"),
            }
        }
        ("GET", ["releases"]) => {
            let page: usize = query(req, "page").and_then(|p| p.parse().ok()).unwrap_or(1);
            let per: usize = query(req, "per_page")
                .and_then(|p| p.parse().ok())
                .unwrap_or(30);
            let all: Vec<Value> = s
                .releases
                .iter()
                .rev()
                .map(|r| release_json(&repo_url, base, r))
                .collect();
            let items: Vec<Value> = all.into_iter().skip((page - 1) * per).take(per).collect();
            ok(200, Value::Array(items))
        }
        ("POST", ["releases"]) => {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let tag = body["tag_name"].as_str().unwrap_or_default().to_owned();
            if s.releases.iter().any(|r| r.tag == tag) {
                return ok(
                    422,
                    json!({"message": "Validation Failed", "documentation_url": "https://docs.github.com/rest",
                    "errors": [{"resource": "Release", "code": "already_exists", "field": "tag_name"}]}),
                );
            }
            let id = s.fresh_id();
            let r = StandinRelease {
                id,
                tag,
                draft: body["draft"].as_bool().unwrap_or(false),
                immutable: false,
                commitish: body["target_commitish"]
                    .as_str()
                    .unwrap_or("main")
                    .to_owned(),
                assets: Vec::new(),
            };
            let v = release_json(&repo_url, base, &r);
            s.releases.push(r);
            ok(201, v)
        }
        ("GET", ["releases", id]) => match s.releases.iter().find(|r| r.id.to_string() == *id) {
            Some(r) => ok(200, release_json(&repo_url, base, r)),
            None => error(404, "Not Found"),
        },
        ("PATCH", ["releases", id]) => {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            match s.releases.iter_mut().find(|r| r.id.to_string() == *id) {
                Some(r) => {
                    if let Some(d) = body["draft"].as_bool() {
                        r.draft = d;
                    }
                    let r = r.clone();
                    ok(200, release_json(&repo_url, base, &r))
                }
                None => error(404, "Not Found"),
            }
        }
        ("GET", ["releases", id, "assets"]) => {
            match s.releases.iter().find(|r| r.id.to_string() == *id) {
                Some(r) => ok(
                    200,
                    Value::Array(
                        r.assets
                            .iter()
                            .map(|a| asset_json(&repo_url, &r.tag, a))
                            .collect(),
                    ),
                ),
                None => error(404, "Not Found"),
            }
        }
        ("POST", ["releases", _, "assets"]) => {
            let name = query(req, "name").unwrap_or_default();
            let id = s.fresh_id();
            let Some(r) = release_of_path(s, &req.path) else {
                return error(404, "Not Found");
            };
            if r.assets.iter().any(|a| a.name == name) {
                return (422, None);
            }
            let a = StandinAsset {
                id,
                name,
                bytes: req.body.clone(),
                state: "uploaded",
            };
            let v = asset_json(&repo_url, &r.tag, &a);
            r.assets.push(a);
            ok(201, v)
        }
        ("DELETE", ["releases", "assets", id]) => {
            for r in &mut s.releases {
                if let Some(i) = r.assets.iter().position(|a| a.id.to_string() == *id) {
                    r.assets.remove(i);
                    return (204, None);
                }
            }
            error(404, "Not Found")
        }
        _ => error(404, "Not Found"),
    }
}

fn query(req: &Request, key: &str) -> Option<String> {
    req.query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

fn release_of_path<'a>(s: &'a mut State, path: &str) -> Option<&'a mut StandinRelease> {
    let id = path.split('/').skip_while(|p| *p != "releases").nth(1)?;
    s.releases.iter_mut().find(|r| r.id.to_string() == id)
}

fn user(base: &str) -> Value {
    let u = format!("{base}/users/release-bot");
    json!({
        "login": "release-bot", "id": 1, "node_id": "U_1", "avatar_url": format!("{base}/avatars/1"),
        "gravatar_id": "", "url": u, "html_url": u, "followers_url": format!("{u}/followers"),
        "following_url": format!("{u}/following"), "gists_url": format!("{u}/gists"),
        "starred_url": format!("{u}/starred"), "subscriptions_url": format!("{u}/subscriptions"),
        "organizations_url": format!("{u}/orgs"), "repos_url": format!("{u}/repos"),
        "events_url": format!("{u}/events"), "received_events_url": format!("{u}/received_events"),
        "type": "User", "site_admin": false,
    })
}

fn git_ref(repo_url: &str, tag: &str, kind: &str, sha: &str) -> Value {
    json!({
        "ref": format!("refs/tags/{tag}"), "node_id": "REF", "url": format!("{repo_url}/git/refs/tags/{tag}"),
        "object": {"type": kind, "sha": sha, "url": format!("{repo_url}/git/{kind}s/{sha}")},
    })
}

fn asset_json(repo_url: &str, tag: &str, a: &StandinAsset) -> Value {
    let digest = (a.state == "uploaded").then(|| {
        let h: String = Sha256::digest(&a.bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sha256:{h}")
    });
    let base = repo_url.split("/repos/").next().unwrap();
    json!({
        "url": format!("{repo_url}/releases/assets/{}", a.id),
        // As on github.com: outside the API, `/<owner>/<repo>/releases/download/<tag>/<name>`.
        "browser_download_url": format!(
            "{}/releases/download/{tag}/{}",
            repo_url.replacen("/repos/", "/", 1),
            a.name
        ),
        "id": a.id, "node_id": format!("RA_{}", a.id), "name": a.name, "label": null, "state": a.state,
        "content_type": "application/octet-stream", "size": a.bytes.len(), "digest": digest,
        "download_count": 0, "created_at": "2023-11-14T22:13:20Z", "updated_at": "2023-11-14T22:13:20Z",
        "uploader": user(base),
    })
}

fn release_json(repo_url: &str, base: &str, r: &StandinRelease) -> Value {
    json!({
        "url": format!("{repo_url}/releases/{}", r.id),
        "html_url": format!("{base}/html/releases/tag/{}", r.tag),
        "assets_url": format!("{repo_url}/releases/{}/assets", r.id),
        "upload_url": format!("{repo_url}/releases/{}/assets{{?name,label}}", r.id),
        "tarball_url": null, "zipball_url": null,
        "id": r.id, "node_id": format!("RE_{}", r.id), "tag_name": r.tag, "target_commitish": r.commitish,
        "name": r.tag, "body": "", "draft": r.draft, "prerelease": false, "immutable": r.immutable,
        "created_at": "2023-11-14T22:13:20Z", "published_at": if r.draft { Value::Null } else { json!("2023-11-14T22:13:20Z") },
        "author": user(base),
        "assets": r.assets.iter().map(|a| asset_json(repo_url, &r.tag, a)).collect::<Vec<_>>(),
    })
}
