//! The fetcher against a local server: redirects, limits, and the address rule, which the
//! tests relax to trust 127.0.0.1 (their server) and nothing else private.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::*;

const IMAGE: &[u8] = b"\x89PNG fake image bytes";

/// A server on 127.0.0.1 answering the routes the tests fetch; its address.
async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let port = addr.port();
    let redirect = |to: String| {
        move || {
            let to = to.clone();
            async move { (StatusCode::FOUND, [(header::LOCATION, to)]) }
        }
    };
    let app = Router::new()
        .route("/img", get(|| async { IMAGE }))
        .route("/big", get(|| async { vec![0u8; 3000] }))
        .route(
            "/big-stream",
            get(|| async {
                let chunks = (0..30).map(|_| Ok::<_, std::io::Error>(vec![0u8; 100]));
                axum::body::Body::from_stream(futures_util::stream::iter(chunks))
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                IMAGE
            }),
        )
        .route(
            "/missing",
            get(|| async { StatusCode::NOT_FOUND.into_response() }),
        )
        .route("/to-img", get(redirect("/img".into())))
        .route(
            "/to-private",
            get(redirect(format!("http://127.0.0.2:{port}/img"))),
        )
        .route(
            "/to-metadata",
            get(redirect("http://169.254.169.254/latest/meta-data/".into())),
        )
        .route("/to-ftp", get(redirect("ftp://example.com/a.png".into())))
        .route("/loop", get(redirect("/loop".into())));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn limits(hosts: &str) -> MediaLimits {
    MediaLimits {
        allowed_hosts: hosts.parse().unwrap(),
        max_image_bytes: 1000,
        fetch_timeout: Duration::from_millis(500),
        ..MediaLimits::default()
    }
}

/// Trusts the test server's address only.
fn test_fetcher(hosts: &str) -> Fetcher {
    let trusted = IpAddr::V4(Ipv4Addr::LOCALHOST);
    Fetcher::with_filter(
        &limits(hosts),
        Arc::new(move |ip| ip != trusted && is_non_public(ip)),
    )
}

fn url(addr: SocketAddr, path: &str) -> Url {
    Url::parse(&format!("http://{addr}{path}")).unwrap()
}

#[tokio::test]
async fn a_url_is_fetched_through_its_redirects() {
    let addr = server().await;
    let f = test_fetcher("127.0.0.1");
    assert_eq!(f.fetch(&url(addr, "/img")).await.unwrap(), IMAGE);
    assert_eq!(f.fetch(&url(addr, "/to-img")).await.unwrap(), IMAGE);
    assert_eq!(
        f.fetch(&url(addr, "/missing")).await,
        Err(MediaError::HttpStatus(404))
    );
    assert_eq!(
        f.fetch(&url(addr, "/loop")).await,
        Err(MediaError::TooManyRedirects(MAX_REDIRECTS))
    );
    assert!(matches!(
        f.fetch(&url(addr, "/to-ftp")).await,
        Err(MediaError::BadRedirect(_))
    ));
}

#[tokio::test]
async fn hosts_must_be_listed() {
    let addr = server().await;
    let none = test_fetcher("");
    assert_eq!(
        none.fetch(&url(addr, "/img")).await,
        Err(MediaError::UrlsNotAllowed)
    );
    let other = test_fetcher("example.com");
    assert_eq!(
        other.fetch(&url(addr, "/img")).await,
        Err(MediaError::HostNotAllowed("127.0.0.1".into()))
    );
}

#[tokio::test]
async fn private_addresses_are_refused_at_every_hop() {
    let addr = server().await;
    // The server's own rule refuses loopback, written as an address or behind a name.
    let strict = Fetcher::new(&limits("*"));
    assert!(matches!(
        strict.fetch(&url(addr, "/img")).await,
        Err(MediaError::PrivateAddress { .. })
    ));
    let by_name = Url::parse(&format!("http://localhost:{}/img", addr.port())).unwrap();
    match strict.fetch(&by_name).await {
        Err(MediaError::PrivateAddress { host, addr }) => {
            assert_eq!(host, "localhost");
            assert!(addr.is_loopback(), "{addr}");
        }
        other => panic!("{other:?}"),
    }
    // A trusted first hop redirecting to a private address, or to a cloud metadata service.
    let f = test_fetcher("*");
    assert_eq!(
        f.fetch(&url(addr, "/to-private")).await,
        Err(MediaError::PrivateAddress {
            host: "127.0.0.2".into(),
            addr: "127.0.0.2".parse().unwrap()
        })
    );
    assert!(matches!(
        f.fetch(&url(addr, "/to-metadata")).await,
        Err(MediaError::PrivateAddress { .. })
    ));
    // --allow-private-media-urls lets them through.
    let open = Fetcher::new(&MediaLimits {
        allow_private: true,
        ..limits("*")
    });
    assert_eq!(open.fetch(&by_name).await.unwrap(), IMAGE);
}

#[tokio::test]
async fn fetches_are_bounded_in_time_and_size() {
    let addr = server().await;
    let f = test_fetcher("127.0.0.1");
    assert_eq!(
        f.fetch(&url(addr, "/slow")).await,
        Err(MediaError::Timeout(1))
    );
    assert_eq!(
        f.fetch(&url(addr, "/big")).await,
        Err(MediaError::TooLarge {
            bytes: 3000,
            limit: 1000
        })
    );
    assert!(matches!(
        f.fetch(&url(addr, "/big-stream")).await,
        Err(MediaError::TooLarge { limit: 1000, .. })
    ));
}

#[test]
fn non_public_addresses_are_told_apart() {
    for private in [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.1",
        "198.18.0.1",
        "::1",
        "::",
        "fc00::1",
        "fd12::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:c0a8:0101::1",
        "2001:db8::1",
    ] {
        assert!(is_non_public(private.parse().unwrap()), "{private}");
    }
    for public in [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "172.32.0.1",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ] {
        assert!(!is_non_public(public.parse().unwrap()), "{public}");
    }
}
