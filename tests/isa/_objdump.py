"""What an emulated unit's object must not hold, read from `objdump -d`: tests/isa's emulation
builds and the package's (tests/hardening/test_emulated.py) check their objects with these."""
import re
import subprocess

# AMX's instructions (VEX-encoded: neither byte 0x62 nor zmm / opmask registers)
_AMX_MNEMONICS = re.compile(r"\b(ldtilecfg|sttilecfg|tilerelease|tileloadd|tileloaddt1|tilestored|tilezero|"
                            r"tdpbf16ps|tdpb[su][su]d)\b")


def disassembly(obj):
    """objdump -d of `obj` (AssertionError where objdump fails)."""
    r = subprocess.run(["objdump", "-d", obj], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout
    return r.stdout


def avx512_amx_lines(obj):
    """Disassembly lines of `obj` that are AVX-512 (EVEX-encoded: first opcode byte 0x62 in
    64-bit mode, or zmm / opmask registers) or AMX."""
    bad = []
    for line in disassembly(obj).splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        raw = parts[1].split()
        text = parts[2]
        if (raw[:1] == ["62"] or raw[:2] == ["67", "62"] or re.search(r"%zmm|%k[0-7]", text)
                or _AMX_MNEMONICS.search(text)):
            bad.append(line.strip())
    return bad


def vpdpwssd_lines(obj):
    """Disassembly lines of `obj` that issue vpdpwssd (AVX-VNNI's VEX form among them)."""
    return [line.strip() for line in disassembly(obj).splitlines() if "vpdpwssd" in line]
