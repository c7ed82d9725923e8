use super::*;

#[test]
fn booleans_read_as_consul_reads_them() {
    for (query, want) in [
        ("", Ok(false)),
        ("passing", Ok(true)),
        ("passing=", Ok(true)),
        ("passing=1", Ok(true)),
        ("passing=t", Ok(true)),
        ("passing=True", Ok(true)),
        ("passing=TRUE", Ok(true)),
        ("passing=0", Ok(false)),
        ("passing=f", Ok(false)),
        ("passing=False", Ok(false)),
        ("passing=FALSE", Ok(false)),
    ] {
        assert_eq!(Params::parse(Some(query)).bool("passing"), want, "{query}");
    }
    let e = Params::parse(Some("passing=yes")).bool("passing").unwrap_err();
    assert!(e.0.contains("?passing") && e.0.contains("\"yes\""), "{e}");
}

#[test]
fn an_empty_index_is_no_index_and_a_bad_one_says_why() {
    let b = Params::parse(Some("index=&wait=1s")).blocking().unwrap();
    assert!(b.index.is_none());
    assert_eq!(b.wait, Duration::from_secs(1));
    let e = Params::parse(Some("index=x")).blocking().unwrap_err().to_string();
    assert!(e.contains("invalid index parameter \"x\""), "{e}");
    assert_eq!(Params::parse(Some("wait=")).blocking().unwrap().wait, DEFAULT_WAIT);
    assert_eq!(Params::parse(Some("wait=1h")).blocking().unwrap().wait, MAX_WAIT);
}

#[test]
fn jitter_adds_less_than_a_sixteenth_of_the_wait() {
    let blocking = Blocking {
        index: None,
        wait: Duration::from_secs(600),
    };
    let jittered: Vec<Duration> = (0..64).map(|_| blocking.wait_with_jitter()).collect();
    for j in &jittered {
        assert!(*j >= blocking.wait && *j < blocking.wait + blocking.wait / 16, "{j:?}");
    }
    // Drawn over the whole wait/16 (37.5s here): 64 draws all under 5s would mean a
    // narrower spread crept back in.
    assert!(jittered.iter().any(|j| *j > blocking.wait + Duration::from_secs(5)));
}

#[test]
fn a_wait_too_short_to_spread_is_unchanged() {
    let blocking = Blocking {
        index: None,
        wait: Duration::from_nanos(15),
    };
    assert_eq!(blocking.wait_with_jitter(), blocking.wait);
}

#[test]
fn the_token_comes_from_the_header_then_bearer_then_the_query() {
    let params = Params::parse(Some("token=q"));
    let mut headers = HeaderMap::new();
    assert_eq!(token(&headers, &params).unwrap().secret(), "q");
    headers.insert(header::AUTHORIZATION, "Bearer  b ".parse().unwrap());
    assert_eq!(token(&headers, &params).unwrap().secret(), "b");
    headers.insert(structs::wire::TOKEN_HEADER, "h".parse().unwrap());
    assert_eq!(token(&headers, &params).unwrap().secret(), "h");
    assert!(token(&HeaderMap::new(), &Params::parse(Some("token="))).is_none());
}
