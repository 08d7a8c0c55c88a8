"""Helpers of the security tests: certificates made at test time (trustme), auth files with tokens."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from sapgrid.server import auth


@dataclass
class Certs:
    """A CA, a server certificate for 127.0.0.1/localhost and client certificates, as PEM files."""

    dir: Path
    ca: trustme.CA

    @property
    def ca_file(self) -> str:
        return str(self.dir / "ca.pem")

    def server(self, name: str = "server") -> tuple[str, str]:
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        return self._write(cert, name)

    def client(self, common_name: str) -> tuple[str, str]:
        cert = self.ca.issue_cert(f"{common_name}.clients.example", common_name=common_name)
        return self._write(cert, f"client-{common_name}")

    def _write(self, cert, name: str) -> tuple[str, str]:
        crt, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        crt.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
        key.write_bytes(cert.private_key_pem.bytes())
        return str(crt), str(key)


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return Certs(directory, ca)


def auth_file(path: Path, tokens: dict[str, tuple[str, str]], subjects: dict[str, tuple[str, str, str]] = ()
              ) -> dict[str, str]:
    """Write an auth file: tokens name -> (role, worlds), made with ``sapgrid``'s own append_token;
    subjects name -> (subject, role, worlds). Returns the tokens by name."""
    made = {name: auth.append_token(str(path), name, role, worlds) for name, (role, worlds) in tokens.items()}
    for name, (subject, role, worlds) in dict(subjects).items():
        with open(path, "a") as f:
            f.write(f'\n[[subjects]]\nname = "{name}"\nsubject = "{subject}"\nrole = "{role}"\nworlds = "{worlds}"\n')
    return made
