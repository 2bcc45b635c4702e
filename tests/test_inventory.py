"""Inventories as Ansible documents them (INI and YAML, groups, children, vars, ranges), plain host lists,
comma lists and --limit patterns; each error names the file and line."""

from __future__ import annotations

import pytest
from debugagent.tools.errors import UsageError
from debugagent.tools.inventory import expand_range, limit, load_inventory

# the example of Ansible's "How to build your inventory" (INI), with variables of each kind
INI = """\
mail.example.com

[webservers]
foo.example.com ansible_host=10.0.0.5 ansible_user=deploy
bar.example.com:2222

[dbservers]
one.example.com ansible_ssh_private_key_file=~/.ssh/db_key
two.example.com   # a comment after the host
db-[a:c].example.com

[gpus]
gpu-[01:03].corp ansible_port=2200

[prod:children]
webservers
dbservers

[prod:vars]
ansible_user=ops
note="two words"

[all:vars]
ansible_port=22
"""

YAML = """\
all:
  hosts:
    mail.example.com:
  children:
    webservers:
      hosts:
        foo.example.com:
          ansible_host: 10.0.0.5
          ansible_user: deploy
        bar.example.com:2222:
    dbservers:
      hosts:
        one.example.com:
        db-[a:c].example.com:
      vars:
        ansible_user: dba
    prod:
      children:
        webservers:
        dbservers:
      vars:
        ansible_user: ops
"""


def by_name(hosts):
    return {h.name: h for h in hosts}


def test_ini_groups_vars_children_ranges(tmp_path):
    p = tmp_path / "hosts.ini"
    p.write_text(INI)
    hs = by_name(load_inventory(str(p)))
    assert set(hs) == {"mail.example.com", "foo.example.com", "bar.example.com", "one.example.com", "two.example.com",
                       "db-a.example.com", "db-b.example.com", "db-c.example.com", "gpu-01.corp", "gpu-02.corp",
                       "gpu-03.corp"}
    assert hs["foo.example.com"].target == "deploy@10.0.0.5:22"         # its own user beats its group's
    assert hs["bar.example.com"].target == "ops@bar.example.com:2222"   # the group's user; the line's port
    assert hs["gpu-02.corp"].target == "gpu-02.corp:2200"
    assert hs["mail.example.com"].target == "mail.example.com:22"
    assert hs["one.example.com"].identity_file is not None and hs["one.example.com"].identity_file.endswith("/.ssh/db_key")
    assert hs["two.example.com"].vars["note"] == "two words"
    assert hs["db-b.example.com"].groups == ["dbservers", "prod"]


def test_yaml_the_same_inventory(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(YAML)
    hs = by_name(load_inventory(str(p)))
    assert set(hs) == {"mail.example.com", "foo.example.com", "bar.example.com", "one.example.com", "db-a.example.com",
                       "db-b.example.com", "db-c.example.com"}
    assert hs["foo.example.com"].target == "deploy@10.0.0.5"
    assert hs["bar.example.com"].target == "ops@bar.example.com:2222"
    assert hs["one.example.com"].target == "dba@one.example.com"   # the nearer group's vars beat the parent's
    assert "prod" in hs["db-a.example.com"].groups


def test_plain_list_and_comma_list(tmp_path):
    p = tmp_path / "hosts.txt"
    p.write_text("# the slow rack\nroot@127.0.0.1:2201\nroot@127.0.0.1:2202\nsim:power-capped\n\n")
    hs = load_inventory(str(p))
    assert [h.target for h in hs] == ["root@127.0.0.1:2201", "root@127.0.0.1:2202", "sim:power-capped"]
    assert [h.target for h in load_inventory("gpu-1,root@gpu-2:2222,")] == ["gpu-1", "root@gpu-2:2222"]


def test_ranges():
    assert expand_range("www[01:03].corp", "x") == ["www01.corp", "www02.corp", "www03.corp"]
    assert expand_range("n[8:10]", "x") == ["n8", "n9", "n10"]
    assert expand_range("r[a:b]-[1:2]", "x") == ["ra-1", "ra-2", "rb-1", "rb-2"]
    with pytest.raises(UsageError, match="not a range"):
        expand_range("x[a:10]", "f:3")


def test_limit_patterns(tmp_path):
    p = tmp_path / "hosts.ini"
    p.write_text(INI)
    hs = load_inventory(str(p))
    names = lambda pat: sorted(h.name for h in limit(hs, pat))  # noqa: E731
    assert names("webservers") == ["bar.example.com", "foo.example.com"]
    assert names("prod:!dbservers") == ["bar.example.com", "foo.example.com"]
    assert names("prod:&dbservers") == sorted(["one.example.com", "two.example.com", "db-a.example.com",
                                               "db-b.example.com", "db-c.example.com"])
    assert names("gpu-0*") == ["gpu-01.corp", "gpu-02.corp", "gpu-03.corp"]
    assert names("~gpu-0[12]") == ["gpu-01.corp", "gpu-02.corp"]
    assert names("all:!prod:!gpus") == ["mail.example.com"]
    with pytest.raises(UsageError, match="matches no host"):
        limit(hs, "nothing-here")


@pytest.mark.parametrize(("text", "suffix", "where", "words"), [
    ("[web\nfoo\n", ".ini", ":1", "not a section header"),
    ("[web]\nfoo ansible_port\n", ".ini", ":2", "is not KEY=VALUE"),
    ("[web:vars]\nnovalue\n", ".ini", ":2", "is not KEY=VALUE"),
    ("[prod:children]\nghost\n", ".ini", "", "no group of the inventory"),
    ("all:\n  hosts: [a, b]\n", ".yml", "", "must map host names"),
    ("all:\n  hosts:\n    a:\n  bogus: 1\n", ".yml", "", "hosts, vars and children only"),
    ("all:\n  hosts:\n   a: [\n", ".yml", ":4", "not valid YAML"),
])
def test_errors_name_the_file_and_line(tmp_path, text, suffix, where, words):
    p = tmp_path / f"inv{suffix}"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        load_inventory(str(p))
    assert f"{p}{where}" in e.value.message and words in e.value.message
    assert e.value.exit_code == 2 and e.value.fix


def test_bad_sources(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_inventory(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="is a folder"):
        load_inventory(str(tmp_path))
    b = tmp_path / "bin"
    b.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UsageError, match="not text"):
        load_inventory(str(b))
    e = tmp_path / "empty.ini"
    e.write_text("# nothing\n")
    with pytest.raises(UsageError, match="holds no host"):
        load_inventory(str(e))
