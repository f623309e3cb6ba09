"""``python -m mooncake.http_metadata_server``: upstream's module path for the HTTP
metadata server; the server itself is Rust (``mooncake._cli``)."""

from mooncake._cli import mooncake_http_metadata_server


def main() -> None:
    mooncake_http_metadata_server()


if __name__ == "__main__":
    main()
