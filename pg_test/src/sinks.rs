//! Receivers the alert delivery tests start on 127.0.0.1: an HTTP receiver (webhooks, pings)
//! and an SMTP sink that speaks STARTTLS with a certificate made for the test. Each serves
//! until dropped; what arrived is kept in order.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One HTTP request as it arrived.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP receiver. `status` is the answer to give; while `hold` is set, requests are
/// recorded and never answered (a receiver that hangs).
pub struct Receiver {
    pub port: u16,
    pub got: Arc<Mutex<Vec<Request>>>,
    pub status: Arc<AtomicU16>,
    pub hold: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    pub fn start() -> Result<Receiver, String> {
        Self::start_on(0)
    }

    pub fn start_on(port: u16) -> Result<Receiver, String> {
        let listener =
            TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("bind {port}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let r = Receiver {
            port,
            got: Arc::default(),
            status: Arc::new(AtomicU16::new(200)),
            hold: Arc::default(),
            stop: Arc::default(),
        };
        let (got, status, hold, stop) = (
            r.got.clone(),
            r.status.clone(),
            r.hold.clone(),
            r.stop.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (got, status, hold, stop) =
                    (got.clone(), status.clone(), hold.clone(), stop.clone());
                std::thread::spawn(move || serve_http(stream, &got, &status, &hold, &stop));
            }
        });
        Ok(r)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.got.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.hold.store(false, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn read_until(stream: &mut dyn Read, end: &[u8], limit: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(end) {
        if buf.len() > limit || stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    Some(buf)
}

fn serve_http(
    mut stream: TcpStream,
    got: &Mutex<Vec<Request>>,
    status: &AtomicU16,
    hold: &AtomicBool,
    stop: &AtomicBool,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Some(head) = read_until(&mut stream, b"\r\n\r\n", 65536) else {
        return;
    };
    let head = String::from_utf8_lossy(&head).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let path = first.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(1 << 20)];
    if stream.read_exact(&mut body).is_err() {
        return;
    }
    if let Ok(mut g) = got.lock() {
        g.push(Request {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&body).to_string(),
        });
    }
    while hold.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let code = status.load(Ordering::SeqCst);
    let _ = write!(
        stream,
        "HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    );
}

/// One e-mail as the SMTP sink received it.
#[derive(Clone, Debug)]
pub struct Mail {
    pub tls: bool,
    pub auth: Option<(String, String)>,
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

/// An SMTP sink on 127.0.0.1 that offers STARTTLS with a certificate for 127.0.0.1 made for
/// the test (`cert_pem`: what the channel trusts), takes AUTH PLAIN and LOGIN, and refuses a
/// message sent before STARTTLS.
pub struct SmtpSink {
    pub port: u16,
    pub cert_pem: String,
    pub mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    pub fn start() -> Result<SmtpSink, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .map_err(|e| e.to_string())?;
        let cert_pem = cert.cert.pem();
        let der = cert.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(vec![der], key)
                .map_err(|e| e.to_string())?,
        );
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let m = mails.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (m, config) = (m.clone(), config.clone());
                std::thread::spawn(move || {
                    let _ = serve_smtp(stream, &config, &m);
                });
            }
        });
        Ok(SmtpSink {
            port,
            cert_pem,
            mails,
        })
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

fn line(s: &mut dyn Stream) -> Option<String> {
    read_until(s, b"\r\n", 1 << 20).map(|b| String::from_utf8_lossy(&b[..b.len() - 2]).to_string())
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map(|b| String::from_utf8_lossy(&b).to_string())
        .unwrap_or_default()
}

fn serve_smtp(
    tcp: TcpStream,
    config: &Arc<rustls::ServerConfig>,
    mails: &Mutex<Vec<Mail>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut plain = Some(tcp);
    let mut tls: Option<rustls::StreamOwned<rustls::ServerConnection, TcpStream>> = None;
    let mut mail = Mail {
        tls: false,
        auth: None,
        from: String::new(),
        to: vec![],
        data: String::new(),
    };
    macro_rules! s {
        () => {
            match tls.as_mut() {
                Some(t) => t as &mut dyn Stream,
                None => plain.as_mut().unwrap() as &mut dyn Stream,
            }
        };
    }
    s!().write_all(b"220 sink ESMTP\r\n")?;
    while let Some(cmd) = line(s!()) {
        let upper = cmd.to_ascii_uppercase();
        if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            let extra = if tls.is_some() {
                "250 AUTH PLAIN LOGIN\r\n"
            } else {
                "250 STARTTLS\r\n"
            };
            s!().write_all(format!("250-sink\r\n{extra}").as_bytes())?;
        } else if upper == "STARTTLS" {
            s!().write_all(b"220 ready\r\n")?;
            let conn =
                rustls::ServerConnection::new(config.clone()).map_err(std::io::Error::other)?;
            tls = Some(rustls::StreamOwned::new(conn, plain.take().unwrap()));
            mail.tls = true;
        } else if upper.starts_with("AUTH PLAIN") {
            let arg = cmd[10..].trim().to_string();
            let arg = if arg.is_empty() {
                s!().write_all(b"334 \r\n")?;
                line(s!()).unwrap_or_default()
            } else {
                arg
            };
            let parts: Vec<String> = b64(&arg).split('\0').map(str::to_string).collect();
            mail.auth = Some((
                parts.get(1).cloned().unwrap_or_default(),
                parts.get(2).cloned().unwrap_or_default(),
            ));
            s!().write_all(b"235 ok\r\n")?;
        } else if upper.starts_with("AUTH LOGIN") {
            s!().write_all(b"334 VXNlcm5hbWU6\r\n")?;
            let user = b64(&line(s!()).unwrap_or_default());
            s!().write_all(b"334 UGFzc3dvcmQ6\r\n")?;
            let pass = b64(&line(s!()).unwrap_or_default());
            mail.auth = Some((user, pass));
            s!().write_all(b"235 ok\r\n")?;
        } else if upper.starts_with("MAIL FROM:") {
            if !mail.tls {
                s!().write_all(b"530 must issue STARTTLS first\r\n")?;
                continue;
            }
            mail.from = cmd[10..].trim().to_string();
            s!().write_all(b"250 ok\r\n")?;
        } else if upper.starts_with("RCPT TO:") {
            mail.to.push(cmd[8..].trim().to_string());
            s!().write_all(b"250 ok\r\n")?;
        } else if upper == "DATA" {
            s!().write_all(b"354 go on\r\n")?;
            let data = read_until(s!(), b"\r\n.\r\n", 1 << 22).unwrap_or_default();
            mail.data = String::from_utf8_lossy(&data).to_string();
            if let Ok(mut g) = mails.lock() {
                g.push(mail.clone());
            }
            s!().write_all(b"250 queued\r\n")?;
        } else if upper == "QUIT" {
            s!().write_all(b"221 bye\r\n")?;
            break;
        } else {
            s!().write_all(b"250 ok\r\n")?;
        }
    }
    Ok(())
}
