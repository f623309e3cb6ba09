use super::*;

fn line(args: &[&str]) -> Flags {
    Flags::new(&argv(args))
}

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("prog")
        .chain(args.iter().copied())
        .map(String::from)
        .collect()
}

#[test]
fn both_value_forms() {
    let mut f = line(&["--port", "80", "--host=::1", "--empty="]);
    let (name, inline) = f.next_flag().unwrap().unwrap();
    assert_eq!(
        (name.as_str(), f.parsed::<u16>("port", inline, "a port")),
        ("port", Ok(80))
    );
    let (name, inline) = f.next_flag().unwrap().unwrap();
    assert_eq!(
        (name.as_str(), f.value("host", inline)),
        ("host", Ok("::1".into()))
    );
    let (name, inline) = f.next_flag().unwrap().unwrap();
    assert_eq!((name.as_str(), inline.as_deref()), ("empty", Some("")));
    assert_eq!(f.next_flag(), Ok(None));
}

#[test]
fn booleans_take_gflags_forms() {
    assert_eq!(boolean("v", None), Ok(true));
    assert_eq!(boolean("v", Some("true")), Ok(true));
    assert_eq!(boolean("v", Some("false")), Ok(false));
    let e = boolean("v", Some("yes")).unwrap_err();
    assert!(
        e.0.contains("--v \"yes\": expected one of true, false"),
        "{e}"
    );
    assert_eq!(switch("json", None), Ok(()));
    assert!(switch("json", Some("1"))
        .unwrap_err()
        .0
        .contains("--json takes no value"));
}

#[test]
fn help_anywhere() {
    assert!(wants_help(&argv(&["--port", "-h"])));
    assert!(wants_help(&argv(&["--bogus", "--help"])));
    assert!(!wants_help(&argv(&["--port", "1"])));
    assert!(!wants_help(&argv(&[])));
}

#[test]
fn missing_values_are_named() {
    let mut f = line(&["--port"]);
    let (_, inline) = f.next_flag().unwrap().unwrap();
    let e = f.value("port", inline).unwrap_err();
    assert!(e.0.contains("--port needs a value"), "{e}");
    let mut f = line(&["--port=http"]);
    let (_, inline) = f.next_flag().unwrap().unwrap();
    let e = f
        .parsed::<u16>("port", inline, "a port (0-65535)")
        .unwrap_err();
    assert!(e.0.contains("\"http\": expected a port"), "{e}");
}

#[test]
fn unknown_flags_and_arguments_are_named() {
    assert_eq!(
        UsageError::unknown("bogus").0,
        "unknown flag --bogus; see --help"
    );
    let e = line(&["-p"]).next_flag().unwrap_err();
    assert!(e.0.contains("unknown flag \"-p\""), "{e}");
    let e = line(&["x"]).next_flag().unwrap_err();
    assert!(e.0.contains("unexpected argument \"x\""), "{e}");
    assert!(line(&["--"]).next_flag().is_err());
    assert!(line(&["--port=1", "--"]).next_flag().is_err());
}

#[test]
fn gflags_lines_take_one_dash_or_two() {
    let v: Vec<String> = ["-rpc_port=1", "--help", "-v", "2", "stray", "-", "--", "x"]
        .map(String::from)
        .to_vec();
    let mut l = GflagsLine::new(&v);
    let flag = |n: &str, v: Option<&str>| Gflag::Flag {
        name: n.into(),
        inline: v.map(String::from),
    };
    assert_eq!(l.next_item(), Some(flag("rpc_port", Some("1"))));
    assert_eq!(l.next_item(), Some(flag("help", None)));
    assert_eq!(l.next_item(), Some(flag("v", None)));
    assert_eq!(l.peek(), Some("2"));
    assert_eq!(l.value(None).as_deref(), Some("2"));
    assert_eq!(l.next_item(), Some(Gflag::Positional("stray".into())));
    assert_eq!(l.next_item(), Some(Gflag::Positional("-".into())));
    assert_eq!(l.next_item(), Some(Gflag::Positional("x".into())));
    assert_eq!(l.next_item(), None);
    let mut end = GflagsLine::new(&["--".to_string()]);
    assert_eq!(end.next_item(), None);
    assert_eq!(
        GflagsLine::new(&[]).value(Some("i".into())).as_deref(),
        Some("i")
    );
    assert_eq!(GflagsLine::new(&[]).value(None), None);
}
