"""``--mesh``'s value read and checked against the world size (jdist/common/meshspec.py), and the option's
check in ClusterConfig: every bad value is one line that names the world size and a value that fits."""

from __future__ import annotations

import pytest

from jdist.common.meshspec import parse_mesh
from jdist.options import ClusterConfig


@pytest.mark.parametrize("text,world,dims", [
    ("tp=4", 4, (("tp", 4),)),
    ("dp=-1,tp=2", 8, (("dp", 4), ("tp", 2))),
    ("pp=2,dp=2,tp=2", 8, (("pp", 2), ("dp", 2), ("tp", 2))),
    (" dp = 1 , tp = -1 ", 2, (("dp", 1), ("tp", 2))),
])
def test_a_mesh_that_fits_is_its_dimensions(text, world, dims):
    assert parse_mesh(text, world) == dims


@pytest.mark.parametrize("text,world,line", [
    ("dp=3", 4, "--mesh dp=3 is 3 ranks, but the cluster has 4: e.g. --mesh dp=4 (or dp=-1)."),
    ("dp=2,tp=3", 4, "--mesh dp=2,tp=3 is 6 ranks, but the cluster has 4: e.g. --mesh dp=2,tp=2 (or dp=-1,tp=2)."),
    ("dp=2,dp=2", 4, "--mesh dp=2,dp=2 names dp twice: give each dimension once, e.g. --mesh dp=2,tp=2 for the "
                     "cluster's 4 ranks."),
    ("dp=-1,tp=-1", 4, "--mesh dp=-1,tp=-1: only one size may be -1 (the rest of the 4 ranks), e.g. --mesh dp=-1,tp=2."),
    ("x=3,y=-1", 4, "--mesh x=3,y=-1: the other sizes (3 ranks) do not divide the cluster's 4: e.g. --mesh x=1,y=4."),
    ("tp=0", 4, "--mesh 'tp=0': give NAME=SIZE pairs separated by commas"),
    ("dp:2", 4, "--mesh 'dp:2': give NAME=SIZE pairs separated by commas"),
])
def test_a_bad_mesh_is_one_line_with_a_value_that_fits(text, world, line):
    with pytest.raises(ValueError) as caught:
        parse_mesh(text, world)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)


def test_the_cluster_config_checks_the_mesh_before_anything_starts():
    ClusterConfig(n=4, mesh="dp=2,tp=2").check()
    with pytest.raises(ValueError, match=r"^--mesh dp=2,tp=2 is 4 ranks, but the cluster has 2"):
        ClusterConfig(n=2, mesh="dp=2,tp=2").check()
