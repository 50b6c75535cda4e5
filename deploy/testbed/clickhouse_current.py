#!/usr/bin/env python3
"""ClickHouse's HTTP interface in front of chdb, the current ClickHouse engine run in process.

The test bed's `clickhouse-current` service (docs/testbed.md). chdb has no network listener; this
gives it the part of the HTTP interface that clients use, and nothing more:

- `POST /` and `GET /?query=`: the query in the `query` URL parameter, the body, or both (then
  joined by a newline, as the server does). Data follows an `INSERT ... FORMAT <name>`, binary or
  not; it goes to chdb's streaming insert (`Connection.send_insert`), so chdb parses it.
- URL parameters: `database`, `default_format` (also as `X-ClickHouse-Database` and
  `X-ClickHouse-Format` headers), `param_*` (query parameters), and every other one that the
  server does not reserve for itself is a setting, applied with `SET` for that request only.
- user and password (`X-ClickHouse-User`/`X-ClickHouse-Key`, HTTP basic auth, or the `user` and
  `password` parameters) against the one configured user.
- `decompress=1` bodies in ClickHouse's compressed-block format (LZ4, ZSTD, none; checksums
  verified with CityHash128 v1.0.2), `compress=1` answers (LZ4 blocks); `Content-Encoding` gzip,
  deflate or lz4 bodies. `Accept-Encoding` is ignored: answers go uncompressed.
- `/ping`, and errors as the server sends them: its status for the code, the body
  `Code: N. DB::Exception: ... (NAME) (version V)`, the header `X-ClickHouse-Exception-Code`.

Every semantic (SQL, types, formats, settings, errors) is chdb's. The front only finds where the
data of an INSERT begins (at its FORMAT clause, by the server's rule), since chdb takes statement
and data apart. chdb runs one engine per process: each request gets its own connection (session)
to it, so its settings and database end with it, and one lock lets one request at a time in.
"""

import argparse
import base64
import email.parser
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import chdb
import lz4.block
import lz4.frame

try:  # CityHash v1.0.2, as ClickHouse checksums its compressed blocks
    from clickhouse_cityhash.cityhash import CityHash128
except ImportError:  # pragma: no cover - then checksums are neither verified nor written
    CityHash128 = None

try:  # ZSTD blocks; pyarrow comes with chdb
    import pyarrow

    ZSTD = pyarrow.Codec("zstd") if pyarrow.Codec.is_available("zstd") else None
except ImportError:  # pragma: no cover
    ZSTD = None

# Parameters the server reads itself: never settings (HTTPHandler's reserved names).
RESERVED = {"query", "database", "default_format", "compress", "decompress", "user", "password",
            "quota_key", "query_id", "stacktrace", "buffer_size", "wait_end_of_query",
            "session_id", "session_timeout", "session_check", "client_protocol_version",
            "close_session", "role"}

# The server's HTTP status per exception name (exceptionCodeToHTTPStatus); others are 500.
STATUS = {}
for _status, _names in {
    401: "REQUIRED_PASSWORD",
    403: "UNKNOWN_USER WRONG_PASSWORD AUTHENTICATION_FAILED SET_NON_GRANTED_ROLE ACCESS_DENIED",
    400: "BAD_ARGUMENTS CANNOT_COMPILE_REGEXP CANNOT_PARSE_TEXT CANNOT_PARSE_ESCAPE_SEQUENCE "
         "CANNOT_PARSE_QUOTED_STRING CANNOT_PARSE_DATE CANNOT_PARSE_DATETIME CANNOT_PARSE_NUMBER "
         "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING CANNOT_PARSE_IPV4 CANNOT_PARSE_IPV6 "
         "CANNOT_PARSE_INPUT_ASSERTION_FAILED CANNOT_PARSE_UUID DUPLICATE_COLUMN ILLEGAL_COLUMN "
         "UNKNOWN_ELEMENT_IN_AST UNKNOWN_TYPE_OF_AST_NODE THERE_IS_NO_COLUMN TOO_DEEP_AST "
         "TOO_BIG_AST UNEXPECTED_AST_STRUCTURE SYNTAX_ERROR INCORRECT_DATA TYPE_MISMATCH "
         "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    404: "UNKNOWN_TABLE UNKNOWN_FUNCTION UNKNOWN_IDENTIFIER UNKNOWN_TYPE UNKNOWN_STORAGE "
         "UNKNOWN_DATABASE UNKNOWN_SETTING UNKNOWN_DIRECTION_OF_SORTING UNKNOWN_AGGREGATE_FUNCTION "
         "UNKNOWN_FORMAT UNKNOWN_DATABASE_ENGINE UNKNOWN_TYPE_OF_QUERY UNKNOWN_ROLE",
    413: "QUERY_IS_TOO_LARGE",
    501: "NOT_IMPLEMENTED",
    503: "SOCKET_TIMEOUT CANNOT_OPEN_FILE CANNOT_SCHEDULE_TASK",
    411: "HTTP_LENGTH_REQUIRED",
    408: "TIMEOUT_EXCEEDED",
    415: "UNSUPPORTED_MEDIA_TYPE",
}.items():
    STATUS.update(dict.fromkeys(_names.split(), _status))

VERSION = chdb.engine_version


class ChError(Exception):
    """An exception as the server reports it: its code, name and text."""

    def __init__(self, code, name, message, text=None):
        super().__init__(message)
        self.code, self.name = code, name
        self.text = text or f"Code: {code}. DB::Exception: {message}. ({name}) (version {VERSION})"

    @staticmethod
    def of(exc):
        """chdb's exception text carries `Code: N. DB::Exception: ... (NAME)`: kept whole, from
        `Code:` on (chdb's Python layer may put words before it), with the version added."""
        text = str(exc)
        m = re.search(r"Code: (\d+)\. (.*)", text, re.S)
        if not m:
            return ChError(1001, "STD_EXCEPTION", text.rstrip("."))
        rest = re.sub(r"\s*\(version [^()]*(\([^()]*\))?\)\s*$", "", m.group(2))
        name = re.search(r"\(([A-Z0-9_]+)\)\s*$", rest)
        return ChError(int(m.group(1)), name.group(1) if name else "", "",
                       f"Code: {m.group(1)}. {rest} (version {VERSION})")


# --- where an INSERT's data begins -----------------------------------------------------------

_TOKEN = re.compile(rb"""
    (?P<space>\s+) | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.|'')*') | (?P<quoted>`(?:[^`\\]|\\.|``)*`|"(?:[^"\\]|\\.|"")*")
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*) | (?P<other>.)
""", re.X | re.S)


def tokens(text):
    """(kind, value, start, end) of the SQL at the head of text, lazily: data is never scanned."""
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        pos = m.end()
        if m.lastgroup not in ("space", "comment"):
            yield m.lastgroup, m.group(), m.start(), m.end()


def split_insert(text):
    """For `INSERT ... FORMAT name<data>`: (statement without FORMAT, format, data), else None.

    The FORMAT clause is the word FORMAT outside parentheses that is not a table name; the data
    starts after the format name, past blanks and one line end (the server's ParserInsertQuery)."""
    toks = tokens(text)
    first = next(toks, None)
    if not first or first[0] != "word" or first[1].upper() != b"INSERT":
        return None
    depth, prev = 0, b""
    for kind, value, start, end in toks:
        up = value.upper()
        if value == b"(":
            depth += 1
        elif value == b")":
            depth -= 1
        elif depth == 0 and kind == "word" and prev not in (b"INTO", b"TABLE", b"."):
            if up in (b"VALUES", b"SELECT", b"WITH"):
                return None  # data in the SQL itself, or none: chdb takes it as a query
            if up == b"FORMAT":
                name = next(toks, None)
                if not name or name[0] not in ("word", "quoted"):
                    return None
                data = name[3]
                while data < len(text) and text[data] in b" \t\f":
                    data += 1
                if text[data:data + 1] == b"\r":
                    data += 1
                if text[data:data + 1] == b"\n":
                    data += 1
                fmt = name[1].decode().strip('`"')
                # chdb appends its FORMAT clause: the line end keeps a trailing comment off it
                return text[:start].decode("utf-8").rstrip() + "\n", fmt, text[data:]
        prev = up
    return None


def output_format(sql, default):
    """The format of a query's answer: its own trailing FORMAT clause, or the default."""
    fmt, depth, toks = default, 0, list(tokens(sql.encode("utf-8")))
    for i, (kind, value, _, _) in enumerate(toks):
        depth += (value == b"(") - (value == b")")
        if depth == 0 and kind == "word" and value.upper() == b"FORMAT" and i + 1 < len(toks):
            after = toks[i + 2][1].upper() if i + 2 < len(toks) else b";"
            if toks[i + 1][0] in ("word", "quoted") and after in (b";", b"SETTINGS"):
                fmt = toks[i + 1][1].decode().strip('`"')
    return fmt


# --- compressed blocks (decompress=1, compress=1) --------------------------------------------

def checksum(block):
    h = CityHash128(block)
    return struct.pack("<QQ", h >> 64, h & 0xFFFFFFFFFFFFFFFF)


def decompress_blocks(buf, verify):
    """ClickHouse's compressed-block stream: per block a 16-byte CityHash128 of the rest, then
    method (1 byte), compressed size with this 9-byte header and decompressed size (LE u32)."""
    out, pos = [], 0
    while pos < len(buf):
        if len(buf) - pos < 25:
            raise ChError(271, "CANNOT_DECOMPRESS", "Cannot decompress: truncated block header")
        method = buf[pos + 16]
        csize, usize = struct.unpack_from("<II", buf, pos + 17)
        block = buf[pos + 16:pos + 16 + csize]
        if csize < 9 or len(block) != csize:
            raise ChError(271, "CANNOT_DECOMPRESS", f"Cannot decompress: block of {csize} bytes is truncated")
        if verify and CityHash128 and checksum(block) != buf[pos:pos + 16]:
            raise ChError(40, "CHECKSUM_DOESNT_MATCH",
                          f"Checksum doesn't match: corrupted data. Size of compressed block: {csize}")
        payload = block[9:]
        try:
            if method == 0x82:
                out.append(lz4.block.decompress(payload, uncompressed_size=usize))
            elif method == 0x02:
                out.append(payload)
            elif method == 0x90 and ZSTD:
                out.append(ZSTD.decompress(payload, decompressed_size=usize).to_pybytes())
            else:
                raise ChError(89, "UNKNOWN_COMPRESSION_METHOD", f"Unknown compression method: {method:#x}")
        except ChError:
            raise
        except Exception as e:
            raise ChError(271, "CANNOT_DECOMPRESS", f"Cannot decompress: {e}")
        pos += 16 + csize
    return b"".join(out)


def compress_blocks(data):
    out = []
    for i in range(0, len(data), 1 << 20):
        chunk = data[i:i + (1 << 20)]
        packed = lz4.block.compress(chunk, store_size=False)
        block = struct.pack("<BII", 0x82, 9 + len(packed), len(chunk)) + packed
        out += [checksum(block), block]
    return b"".join(out)


# --- the server ------------------------------------------------------------------------------

class Front:
    """The engine and the lock. chdb runs one embedded engine per process, on one data path;
    each request gets a connection of its own to it (a fresh session, like the server's query
    context: its SET, USE and readonly end with it), and the lock lets one request at a time
    use the engine. One connection stays open so that the engine does not shut down."""

    def __init__(self, path, user, password):
        self.path, self.user, self.password = path, user, password
        self.engine = chdb.connect(path)
        self.lock = threading.Lock()
        self.timezone = self.engine.query("SELECT timezone()", "TSV").bytes().decode().strip()
        self.hostname = socket.gethostname()

    def run(self, sql, data_split, settings, database, fmt, params):
        """One request's statement in a session of its own. Returns (body, summary)."""
        with self.lock:
            conn = chdb.connect(self.path)
            try:
                if settings:
                    conn.query("SET " + ", ".join(f"{quote_id(k)} = {quote_str(v)}"
                                                  for k, v in settings.items()))
                if database:
                    conn.query("USE " + quote_id(database))
                if data_split:
                    head, in_fmt, data = data_split
                    ins = conn.send_insert(head, in_fmt)
                    try:
                        if data:
                            ins.append(data)
                    except Exception:
                        ins.cancel()
                        raise
                    r = ins.finish()
                    return b"", {"written_rows": r.rows_written, "written_bytes": r.bytes_written,
                                 "elapsed_ns": int(r.elapsed * 1e9)}
                r = conn.query(sql, fmt, params=params)
                return r.bytes(), {"read_rows": r.rows_read(), "read_bytes": r.bytes_read(),
                                   "written_rows": r.rows_written(),
                                   "written_bytes": r.bytes_written(),
                                   "elapsed_ns": int(r.elapsed() * 1e9)}
            finally:
                conn.close()

    def close(self):
        with self.lock:
            self.engine.close()


def quote_id(name):
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_str(value):
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    front = None  # set in main

    def version_string(self):
        return "ClickHouse (chdb)"

    def do_GET(self):
        self.handle_query()

    def do_POST(self):
        self.handle_query()

    def log_request(self, code="-", size="-"):
        pass  # errors are logged in handle_query

    def handle_query(self):
        query_id = str(uuid.uuid4())
        try:
            url = urlsplit(self.path)
            body = self.read_body(required=url.path == "/")
            if url.path in ("/ping", "/replicas_status"):
                return self.answer(200, b"Ok.\n", {})
            if url.path != "/":
                return self.answer(404, f"There is no handle {url.path}\n".encode(), {})
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            query_id = params.get("query_id") or self.headers.get("X-ClickHouse-Query-Id") or query_id
            self.authenticate(params)
            ctype = self.headers.get("Content-Type", "")
            if ctype.startswith("multipart/form-data"):  # the query and param_* as form fields
                form = email.parser.BytesParser().parsebytes(
                    b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
                for part in form.get_payload():
                    params[part.get_param("name", header="content-disposition")] = \
                        part.get_payload(decode=True).decode()
                body = b""
            body = self.decode_body(body, params)
            query = params.get("query", "").encode()
            text = query + b"\n" + body if query else body
            if not text and self.command == "GET":
                return self.answer(200, b"Ok.\n", {})
            if not text.strip():
                raise ChError(62, "SYNTAX_ERROR", "Empty query")
            settings = {k: v for k, v in params.items()
                        if k and k not in RESERVED and not k.startswith("param_")}
            if self.command == "GET":  # as the server: GET requests only read
                settings = {"readonly": "2", **settings}
            qparams = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
            database = self.headers.get("X-ClickHouse-Database") or params.get("database")
            fmt = self.headers.get("X-ClickHouse-Format") or params.get("default_format") \
                or "TabSeparated"
            data_split = split_insert(text)
            sql = None
            if not data_split:
                try:
                    sql = text.decode("utf-8")
                except UnicodeDecodeError:
                    raise ChError(62, "SYNTAX_ERROR", "The query is not valid UTF-8 and carries no "
                                  "INSERT ... FORMAT clause that data could follow")
            started = time.monotonic()
            try:
                out, summary = self.front.run(sql, data_split, settings, database, fmt, qparams)
            except ChError:
                raise
            except Exception as e:
                raise ChError.of(e)
            headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.front.timezone,
                       "X-ClickHouse-Summary": json.dumps({k: str(v) for k, v in summary.items()},
                                                          separators=(",", ":"))}
            if sql is not None:
                headers["X-ClickHouse-Format"] = output_format(sql, fmt)
            if params.get("compress") == "1" and CityHash128:
                out = compress_blocks(out)
            self.answer(200, out, headers)
            if time.monotonic() - started > 10:
                self.log_message("slow (%.1fs): %s", time.monotonic() - started, text[:200])
        except ChError as e:
            status = STATUS.get(e.name, 500)
            self.log_message("%s %s: %s", status, e.name, e.text[:300])
            self.answer(status, (e.text + "\n").encode(),
                        {"X-ClickHouse-Exception-Code": str(e.code), "X-ClickHouse-Query-Id": query_id})
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # a malformed request: answered, and the connection closed
            self.close_connection = True
            self.log_message("500 %r", e)
            self.answer(500, f"Code: 1001. DB::Exception: {e}. (STD_EXCEPTION) (version {VERSION})\n"
                        .encode(), {"X-ClickHouse-Exception-Code": "1001"})

    def read_body(self, required):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline(1 << 16).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1 << 16) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(1 << 16)
        length = self.headers.get("Content-Length")
        if length is None:
            if self.command == "POST" and required:
                self.close_connection = True
                raise ChError(381, "HTTP_LENGTH_REQUIRED", "The Transfer-Encoding is not chunked "
                              "and there is no Content-Length header for POST request")
            return b""
        return self.rfile.read(int(length))

    def authenticate(self, params):
        user = self.headers.get("X-ClickHouse-User")
        password = self.headers.get("X-ClickHouse-Key")
        auth = self.headers.get("Authorization", "")
        if user is None and password is None and auth[:6].lower() == "basic ":
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        if user is None and password is None:
            user, password = params.get("user"), params.get("password")
        user = user or "default"
        if user != self.front.user or (password or "") != self.front.password:
            raise ChError(516, "AUTHENTICATION_FAILED", f"{user}: Authentication failed: password "
                          "is incorrect, or there is no user with such name.")

    def decode_body(self, body, params):
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        try:
            if encoding in ("gzip", "deflate", "x-gzip"):
                body = zlib.decompress(body, 47 if "gzip" in encoding else 15)
            elif encoding == "lz4":
                body = lz4.frame.decompress(body)
        except Exception as e:
            raise ChError(271, "CANNOT_DECOMPRESS", f"Cannot decompress the {encoding} body: {e}")
        if encoding not in ("", "identity", "gzip", "deflate", "x-gzip", "lz4"):
            raise ChError(48, "NOT_IMPLEMENTED", f"Content-Encoding {encoding} is not supported here")
        if params.get("decompress") == "1":
            verify = params.get("http_native_compression_disable_checksumming_on_decompress",
                                "0") in ("0", "false")
            body = decompress_blocks(body, verify)
        return body

    def answer(self, status, body, headers):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Server-Display-Name", self.front.hostname)
        for k, v in headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18124)
    ap.add_argument("--path", required=True, help="the data directory")
    ap.add_argument("--user", default="default")
    ap.add_argument("--password-env", default="CLICKHOUSE_PASSWORD",
                    help="the variable holding the user's password (default: empty password)")
    args = ap.parse_args()

    started = time.monotonic()
    front = Handler.front = Front(args.path, args.user, os.environ.get(args.password_env, ""))
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ClickHouse {VERSION} (chdb {chdb.__version__}) on http://{args.host}:{args.port}, data "
          f"in {args.path}, ready in {time.monotonic() - started:.2f}s; checksums "
          f"{'verified' if CityHash128 else 'not verified (no clickhouse-cityhash)'}", flush=True)
    server.serve_forever()
    server.server_close()
    front.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
