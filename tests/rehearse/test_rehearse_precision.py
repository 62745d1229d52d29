"""The rehearsal's CPU precision: bf16 where the CPU has avx512_bf16, else fp32."""

from __future__ import annotations

import pytest

from experiments.rehearse.precision import cpu_bf16, cpu_flags, has_bf16, read_cpuinfo

EPYC_ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""
# avx512f without its bf16 extension (Ice Lake): still emulated
ICE_LAKE = "flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes bf16 i8mm\n"


def test_cpu_flags_reads_every_flags_line():
    assert cpu_flags(EPYC_ZEN3) == {"fpu", "vme", "sse", "sse2", "avx", "avx2", "fma", "bmi2",
                                    "sha_ni"}  # fmt: skip
    assert cpu_flags(ARM) == {"fp", "asimd", "evtstrm", "aes", "bf16", "i8mm"}
    assert cpu_flags("") == set()


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [(EPYC_ZEN3, False), (SAPPHIRE_RAPIDS, True), (ICE_LAKE, False), (ARM, False), ("", False)],
)
def test_has_bf16_needs_the_avx512_bf16_flag(cpuinfo, native):
    assert has_bf16(cpuinfo) is native


def test_without_avx512_bf16_auto_and_true_fall_back_to_fp32():
    for configured in ("auto", True):
        value, note = cpu_bf16(configured, EPYC_ZEN3)
        assert value is False
        assert "bf16 -> fp32: this CPU has no avx512_bf16" in note


def test_with_avx512_bf16_bf16_stays():
    assert cpu_bf16("auto", SAPPHIRE_RAPIDS) == (
        True,
        "train.bf16=true: 'auto' resolves to bf16 on the papers' GPUs (on CPU to fp32)",
    )
    assert cpu_bf16(True, SAPPHIRE_RAPIDS) == (True, "")


def test_fp32_config_stays_fp32_and_bad_values_are_refused():
    assert cpu_bf16(False, SAPPHIRE_RAPIDS) == (False, "")
    assert cpu_bf16(False, EPYC_ZEN3) == (False, "")
    with pytest.raises(ValueError, match="train.bf16='yes'"):
        cpu_bf16("yes", EPYC_ZEN3)


def test_read_cpuinfo_of_a_missing_file_is_empty(tmp_path):
    assert read_cpuinfo(tmp_path / "none") == ""
    (tmp_path / "cpuinfo").write_text(SAPPHIRE_RAPIDS)
    assert has_bf16(read_cpuinfo(tmp_path / "cpuinfo"))
