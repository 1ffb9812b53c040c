"""The test Hub server speaks enough of the protocol for the real huggingface_hub client, and its
failure injection does what it says. Everything here is real HTTP through HfApi."""

import threading
import time

import httpx2
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from tests.hubserver import READ_TOKEN, WRITE_TOKEN, git_blob_sha1, hub  # noqa: F401  (fixture)

REPO = "owner/name"


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=WRITE_TOKEN)


def test_create_repo_private_and_exist_ok(api, hub):
    api.create_repo(REPO, private=True, exist_ok=True)
    api.create_repo(REPO, private=True, exist_ok=True)
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(REPO)
    assert err.value.response.status_code == 409
    info = api.model_info(REPO)
    assert info.private and len(info.sha) == 40


def test_commit_tree_commits_and_download(api, hub, tmp_path):
    api.create_repo(REPO, private=True)
    head = api.repo_info(REPO).sha
    ci = api.create_commit(REPO, [CommitOperationAdd("d/a.bin", b"A" * 5000), CommitOperationAdd("b.txt", b"b")],
                           commit_message="two files", parent_commit=head)
    assert len(ci.oid) == 40 and ci.oid != head
    tree = {e.path: getattr(e, "size", None) for e in api.list_repo_tree(REPO, recursive=True)}
    assert tree == {"d": None, "d/a.bin": 5000, "b.txt": 1}
    assert sorted(api.list_repo_files(REPO)) == ["b.txt", "d/a.bin"]
    assert [e.path for e in api.list_repo_tree(REPO, path_in_repo="d")] == ["d/a.bin"]
    assert [c.title for c in api.list_repo_commits(REPO)] == ["two files", "initial commit"]
    path = api.hf_hub_download(REPO, "d/a.bin", revision=ci.oid, local_dir=tmp_path)
    assert open(path, "rb").read() == b"A" * 5000
    r = httpx2.head(f"{hub.url}/{REPO}/resolve/main/d/a.bin", headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
    assert r.headers["X-Repo-Commit"] == ci.oid and r.headers["Content-Length"] == "5000"
    assert r.headers["ETag"] == f'"{git_blob_sha1(b"A" * 5000)}"'
    r = httpx2.get(f"{hub.url}/{REPO}/resolve/main/d/a.bin",
                   headers={"Authorization": f"Bearer {WRITE_TOKEN}", "Range": "bytes=4990-"})
    assert r.status_code == 206 and r.content == b"A" * 10
    snap = api.snapshot_download(REPO, local_dir=tmp_path / "snap")
    assert (tmp_path / "snap" / "b.txt").read_bytes() == b"b" and snap


def test_folder_delete_and_old_revisions_stay_readable(api, hub, tmp_path):
    api.create_repo(REPO)
    first = api.create_commit(REPO, [CommitOperationAdd("c/x", b"x"), CommitOperationAdd("c/y", b"y")],
                              commit_message="add").oid
    api.create_commit(REPO, [CommitOperationDelete("c/", is_folder=True)], commit_message="rm")
    assert api.list_repo_files(REPO) == []
    assert sorted(api.list_repo_files(REPO, revision=first)) == ["c/x", "c/y"]
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(REPO, [CommitOperationDelete("nope.txt")], commit_message="rm missing")
    assert err.value.response.status_code == 404
    assert [c.deleted for c in hub.commit_log(REPO)][-1] == ["c/"]


def test_stale_parent_commit_is_412(api, hub):
    api.create_repo(REPO)
    old = api.repo_info(REPO).sha
    api.create_commit(REPO, [CommitOperationAdd("a", b"1")], commit_message="one", parent_commit=old)
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(REPO, [CommitOperationAdd("a", b"2")], commit_message="two", parent_commit=old)
    assert err.value.response.status_code == 412
    assert hub.files(REPO) == {"a": b"1"}


def test_auth_rules(api, hub):
    api.create_repo(REPO, private=True)
    with pytest.raises(RepositoryNotFoundError) as err:
        HfApi(endpoint=hub.url, token=False).repo_info(REPO)
    assert err.value.response.status_code == 401
    ro = HfApi(endpoint=hub.url, token=READ_TOKEN)
    assert ro.repo_info(REPO).private
    with pytest.raises(HfHubHTTPError) as err:
        ro.create_commit(REPO, [CommitOperationAdd("a", b"1")], commit_message="no")
    assert err.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url, token="hf_wrong").repo_info(REPO)
    assert err.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url, token=False).create_repo("owner/other")
    assert err.value.response.status_code == 401


def test_status_fault_counts_down(api, hub):
    api.create_repo(REPO)
    hub.inject("status", status=500, times=2, method="GET", path="/api/models/")
    for _ in range(2):
        r = httpx2.get(f"{hub.url}/api/models/{REPO}", headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
        assert r.status_code == 500
    assert api.repo_info(REPO).sha


def test_drop_upload_cuts_the_connection(api, hub):
    api.create_repo(REPO)
    hub.inject("drop_upload", method="POST", path="/commit/")
    with pytest.raises(httpx2.TransportError):
        api.create_commit(REPO, [CommitOperationAdd("big", b"z" * 500_000)], commit_message="cut")
    assert hub.files(REPO) == {}


def test_hang_outlives_a_client_timeout(hub):
    hub.create(REPO, private=False)
    hub.inject("hang", seconds=2, method="GET")
    with pytest.raises(httpx2.TimeoutException):
        httpx2.get(f"{hub.url}/api/models/{REPO}", timeout=0.3)


def test_download_faults(api, hub, tmp_path):
    api.create_repo(REPO)
    api.create_commit(REPO, [CommitOperationAdd("f", bytes(range(256)) * 400)], commit_message="f")
    url, auth = f"{hub.url}/{REPO}/resolve/main/f", {"Authorization": f"Bearer {WRITE_TOKEN}"}
    hub.inject("flip_download")
    body = httpx2.get(url, headers=auth).content
    assert len(body) == 102400 and body != bytes(range(256)) * 400
    hub.inject("drop_download")
    with pytest.raises(httpx2.TransportError):
        httpx2.get(url, headers=auth)
    hub.corrupt_stored(REPO, "f", mode="truncate")
    assert len(httpx2.get(url, headers=auth).content) == 51200


def test_throttle_limits_bandwidth(api, hub):
    api.create_repo(REPO)
    api.create_commit(REPO, [CommitOperationAdd("f", b"q" * 400_000)], commit_message="f")
    hub.throttle_bps = 1_000_000
    t0 = time.monotonic()
    httpx2.get(f"{hub.url}/{REPO}/resolve/main/f", headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
    assert 0.35 < time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    api.create_commit(REPO, [CommitOperationAdd("g", b"q" * 300_000)], commit_message="g")  # 400 kB as base64
    assert time.monotonic() - t0 > 0.35


def test_throttle_is_shared_by_parallel_connections(api, hub):
    api.create_repo(REPO)
    api.create_commit(REPO, [CommitOperationAdd(n, b"w" * 300_000) for n in ("x", "y")], commit_message="xy")
    hub.throttle_bps = 1_000_000
    auth = {"Authorization": f"Bearer {WRITE_TOKEN}"}
    threads = [threading.Thread(target=httpx2.get, args=(f"{hub.url}/{REPO}/resolve/main/{n}",),
                                kwargs={"headers": auth}) for n in ("x", "y")]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 > 0.5, "two 300 kB downloads share 1 MB/s"
