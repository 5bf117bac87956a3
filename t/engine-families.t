#!/usr/bin/env perl
# Every model family the engine runs, on a tiny random-weight F32 GGUF file of that family
# (build/bench/synth_gguf --arch FAMILY --shape tiny, the Llama 2 vocabulary), against
# llama.cpp (build/bench/llamacpp_ref on the pinned npm build, Kvgate::LlamaCpp: F32 K/V
# cache, no flash attention), with a fixed 100-token prompt:
#
#   - the file loads in kvgate as that architecture;
#   - the 64 greedy tokens are llama.cpp's, and so are their logprobs within the family's
#     tolerance;
#   - the log-softmax of the logits at the last prompt position, over the whole
#     vocabulary, is llama.cpp's within the family's tolerance;
#   - kvgate's margin (top-1 minus top-2 logit) at every one of the 64 choices is more
#     than twice the tolerance: if each log-prob may move by the tolerance, no choice can
#     flip by rounding, so the greedy comparison is a real check (when it is not, the test
#     says the model's margins are too small, not that the engines disagree);
#   - build/t/family_check: chunked prefill, batch 1 vs 8 and a prefix-cache hit give
#     bit-identical logits (see t/tools/family_check.c).
#
# Backends: the CPU always; the CUDA backend, emulated on the host (build/emu: the same
# kernels and host code as on a GPU) for every family, family_check included, with its own
# tolerance (it rounds GEMM inputs and the KV cache to BF16).
#
# The ASan pass (KVGATE_ASAN=1) runs the ASan builds of kvgate-generate and family_check on
# the CPU; the emulated backend has no ASan build here (its kernels are checked under ASan by
# build/asan/t/cuda_backend), so its rows run in the plain pass only. llama.cpp's side is
# the plain llamacpp_ref in both passes (its library is a prebuilt one).
#
# GGUF files are kept in $BUILD/families-gguf (rewritten when synth_gguf is newer).
# BUILD=<dir> picks the build.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir tempfile);
use List::Util qw(max);
use POSIX ();
use Test::More;
use Time::HiRes qw(time);
use Kvgate::Engine;
use Kvgate::LlamaCpp;

# The families, one line each (adding one: its line here, once synth_gguf writes it and the
# engine runs it; cuda => 0 until the CUDA backend does). Keys:
#   tol          the largest |Δ log-prob| against llama.cpp accepted on the CPU (every
#                vocabulary entry at the last prompt position, and each chosen token's)
#   cuda         the same on the emulated CUDA backend; 0: the family does not run there
#   arch         synth_gguf's --arch (default: the family's name; none given for llama,
#                the writer's default)
#   seed         the prompt's (default 1): tiny random weights leave some prompts a choice
#                within a few hundredths of its runner-up, too close for a greedy
#                comparison at the CUDA tolerance (llama with seed 2024: 0.058 at the
#                first choice); another seed is another fixed prompt
#   cuda_greedy  how many leading choices must be beyond rounding on the CUDA backend
#                (default all 64; the comparison stops at the first that is not)
#   tol_top      the bound on the likely tokens' and the chosen tokens' |Δ log-prob|, which
#                the margins are held to (default tol); cuda_top the same for cuda
#   cuda_rel     the emulated CUDA backend's prompt logits against the CPU backend's: the
#                largest difference as a share of the largest logit; 0: not on CUDA
#
# llama, measured (tiny F32, the prompt below): on the CPU 1.3e-6 over the vocabulary and
# 2e-6 on the chosen tokens (float rounding: both engines compute in F32, in another order;
# the printed log-probs have 6 decimals); 2e-5 leaves 15x of margin and stays well below
# what a real loss of precision costs (llama.cpp with its default F16 K/V cache is 8.7e-4
# away, and fails here). On the CUDA backend (emulated): 0.018 over the vocabulary, 0.016 on
# the chosen tokens (BF16 GEMM inputs and K/V); 0.05 is 2.8x that. kvgate's margins: at
# least 0.24 at every choice on both backends, above 2 x 0.05.
#
# The other families' files (synth_gguf) amplify: logits 32x larger (gemma2 8x), q/k gains,
# so that greedy decoding has margins; their rounding differences grow with them.
# Measured (CPU, these prompts; "likely" = tokens llama.cpp gives p > 1e-3):
#   qwen2 3.2e-4 over the vocabulary (1.7e-4 likely), qwen3 3.3e-4 (1.1e-4), qwen3moe
#   3.2e-4 (1.8e-4), phi3 1.6e-4 (7.6e-5), mistral3 1.8e-4 (4.5e-5; chosen tokens 1.8e-4),
#   gpt-oss 4.1e-4 (1.8e-4; chosen 9.4e-5): 1e-3 for each. mistral3 and gpt-oss rotate with
#   YaRN (factor 4 over an original context of 64: of the 32 pairs 1 keeps its frequency, 5
#   or 6 blend, the rest are interpolated) and mistral3's queries take the temperature step
#   at position 128; what the comparison resolves, measured: without YaRN's ramp both are
#   ~99 apart (no greedy token equal), without gpt-oss's 1 + 0.1 ln 4 on cos/sin 13, with
#   Llama 4's offset of 1 in mistral3's temperature (the step at 127) the greedy tokens part
#   at choice 28 (all measured with seed 1). Their seeds, the widest margins of seeds 1..30
#   (kvgate-generate --top2-gap): 16 and 17, at least 0.25 and 0.29 (seed 1: 0.038, 0.091).
#   gemma2 0.008 (0.0034), gemma3 0.19 (0.098): llama.cpp's CPU GELU is an F16 lookup
#   table (the input and the result rounded to F16; ggml's GGML_GELU_FP16), kvgate's the
#   exact tanh form Hugging Face computes. Emulating the table in kvgate took gemma3's
#   single-token difference from 0.040 to 1.3e-4 and gemma2's from 0.0056 to 7.7e-6;
#   gemma3's 6 layers and q/k gains make it the most sensitive of all (llama.cpp's own F16
#   K/V cache moves it by 0.1-0.24 against its F32 one). tol_top (the likely tokens, the
#   chosen ones and the margins) 0.015 and 0.15.
#   cuda_rel: the emulated CUDA backend against the CPU's prompt logits, as a share of the
#   largest (the CUDA backend rounds GEMM inputs and K/V to BF16): qwen2 0.014, qwen3
#   0.052, qwen3moe 0.015 (its router F32 on both backends, the experts' inputs BF16 on
#   the CUDA one), gemma2 0.016, gemma3 0.060, phi3 0.020 (its tiny file rotates 48 of 64
#   dimensions, as Phi-4-mini), mistral3 0.0125, gpt-oss 0.028 (sinks, o bias, router and
#   expert biases, the clamped SwiGLU; its experts' inputs BF16); t/unit/cuda_backend.c and
#   t/unit/cuda_moe.c hold gentler models to 0.03. mistral3's prompt (positions 0..99) and
#   family_check's decode steps stay before its temperature's first step (128), so here
#   the CUDA backend's query temperature is 1 throughout; t/unit/cuda_backend.c and
#   cuda_kernels.c check it where it steps.
my @FAMILIES = (
    { family => 'llama', tol => 2e-5, cuda => 0.05 },
    { family => 'qwen2', tol => 1e-3, cuda_rel => 0.03, seed => 7 },
    { family => 'qwen3', tol => 1e-3, cuda_rel => 0.1, seed => 10 },
    { family => 'qwen3moe', tol => 1e-3, cuda_rel => 0.03, seed => 2 },
    { family => 'gemma2', tol => 0.03, tol_top => 0.015, cuda_rel => 0.04, seed => 10 },
    { family => 'gemma3', tol => 0.6, tol_top => 0.15, cuda_rel => 0.15, seed => 37 },
    { family => 'phi3', tol => 1e-3, cuda_rel => 0.04, seed => 6 },
    { family => 'mistral3', tol => 1e-3, cuda_rel => 0.03, seed => 16 },
    { family => 'gpt-oss', tol => 1e-3, cuda_rel => 0.06, seed => 17 },
);

my $build = Kvgate::Engine::build_dir();
my $shared = Kvgate::Engine::shared_dir();
my $asan = Kvgate::Engine::asan();
my $vocab = "$shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf";
my $synth = "$build/bench/synth_gguf";
my $ref = "$build/bench/llamacpp_ref";
my $gen = Kvgate::Engine::bin('kvgate-generate');
my $check = $asan ? "$build/asan/t/family_check" : "$build/t/family_check";
my $emu_gen = "$build/emu/bin/kvgate-generate";
my $emu_check = "$build/emu/t/family_check";
my $steps = 64;
my $threads = 2;

for my $f ($synth, $ref, $gen, $check, $asan ? () : ($emu_gen, $emu_check)) {
    ok(-x $f, "$f is built") or BAIL_OUT("build it first: make BUILD=$build $f");
}
ok(-f $vocab, "the vocabulary $vocab") or BAIL_OUT('no vocabulary');
my ($lc, $why) = Kvgate::LlamaCpp::install();
ok($lc, "llama.cpp $Kvgate::LlamaCpp::VERSION_PINNED installed") or BAIL_OUT("llama.cpp: $why");

my $dir = tempdir('kvgate-families-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $gguf_dir = "$build/families-gguf";
system('mkdir', '-p', $gguf_dir) == 0 or die "mkdir $gguf_dir";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or return ''; local $/; my $s = <$fh>; $s // '' }

# Runs a command; returns (exit status, stdout, stderr).
sub run {
    my (@cmd) = @_;
    my (undef, $out) = tempfile(DIR => $dir);
    my (undef, $err) = tempfile(DIR => $dir);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null' or die;
        open STDOUT, '>', $out or die;
        open STDERR, '>', $err or die;
        exec @cmd or POSIX::_exit(127);
    }
    waitpid $pid, 0;
    my $st = $?;
    my @r = (($st & 127) ? 128 + ($st & 127) : $st >> 8, slurp($out), slurp($err));
    unlink $out, $err;
    return @r;
}

# The family's tiny F32 file, written unless already there and newer than the writer.
sub gguf {
    my ($fam) = @_;
    my $arch = $fam->{arch} // $fam->{family};
    my $f = "$gguf_dir/$fam->{family}-tiny-f32.gguf";
    return (0, $f, '') if -s $f && -M $f <= -M $synth;
    my @arch = $arch eq 'llama' ? () : ('--arch', $arch);
    my ($rc, $out, $err) = run($synth, @arch, '--shape', 'tiny', '--dtype', 'f32', '--vocab', $vocab,
                               '--out', "$f.tmp.$$");
    if ($rc == 0 && !rename("$f.tmp.$$", $f)) {
        ($rc, $err) = (1, "rename $f.tmp.$$: $!");
    }
    unlink "$f.tmp.$$";
    return ($rc, $f, $out . $err);
}

# The prompt: BOS, then 99 ids of the 32,000-piece vocabulary from a fixed LCG.
sub prompt_ids {
    my ($seed) = @_;
    my ($s, @ids) = ($seed, 1);
    for (2 .. 100) {
        $s = ($s * 1103515245 + 12345) % 2147483648;
        push @ids, 3 + ($s >> 8) % 31997;
    }
    return join ' ', @ids;
}

sub read_logits {
    my ($f) = @_;
    return [ map { 0 + $_ } split ' ', slurp($f) ];
}

sub log_softmax {
    my ($l) = @_;
    my $m = max(@$l);
    my $s = 0;
    $s += exp($_ - $m) for @$l;
    my $z = $m + log($s);
    return [ map { $_ - $z } @$l ];
}

# "id logprob" lines -> ([ids], [logprobs])
sub parse_choices {
    my ($out) = @_;
    my (@ids, @lp);
    for (split /\n/, $out) {
        next unless /^(\d+) (-?[\d.]+)$/;
        push @ids, $1;
        push @lp, $2;
    }
    return (\@ids, \@lp);
}

# One engine run: (ok, ids, logprobs, prompt logits, min gap, gap step, stderr).
sub generate {
    my ($bin, $label, $model, $prompt, @extra) = @_;
    my $n = $steps;
    ($n, @extra) = @extra[1 .. $#extra] if @extra && $extra[0] eq 'steps';
    my $lf = "$dir/$label.logits";
    unlink $lf;
    my ($rc, $out, $err) = run($bin, '--model', $model, '--prompt-ids', $prompt, '--threads', $threads, '--ids',
                               '--logprobs', '--temperature', '0', '--max-tokens', $n, '--stop', 'none',
                               '--prompt-logits', $lf, '--top2-gap', @extra);
    my ($ids, $lp) = parse_choices($out);
    my ($gap, $at) = $err =~ /^top2-gap: (\S+) at step (\d+) of \d+$/m;
    my @gaps = $err =~ /^top2-gap\[\d+\]: (\S+)$/mg;
    return { rc => $rc, ids => $ids, lp => $lp, logits => read_logits($lf), gap => $gap, gap_at => $at,
             gaps => \@gaps, err => $err };
}

# kvgate on one backend against llama.cpp: the checks above; returns the summary's part.
sub compare {
    my ($name, $be, $kv, $lcr, $tol, $tol_top, $need) = @_;
    my $V = scalar @{ $lcr->{logits} };
    ok($V > 0 && @{ $kv->{logits} } == $V, "$name $be: the prompt logits from each engine ($V)")
        or return "$be: no logits to compare";
    my ($a, $b) = (log_softmax($kv->{logits}), log_softmax($lcr->{logits}));
    my $d = 0;
    for my $i (0 .. $V - 1) {
        my $x = abs(($a->[$i] // 1e9) - $b->[$i]);
        $d = $x if $x > $d;
    }
    ok($d <= $tol, sprintf('%s %s: max |Δ log-prob| over the vocabulary at the last prompt position %.3g <= %g',
                           $name, $be, $d, $tol));
    # The likely tokens (probability above 1e-3 in llama.cpp), where a greedy choice is
    # made: their own bound, which the margins below are held to.
    my $dt = 0;
    for my $i (0 .. $V - 1) {
        next unless $b->[$i] > log(1e-3);
        my $x = abs(($a->[$i] // 1e9) - $b->[$i]);
        $dt = $x if $x > $dt;
    }
    ok($dt <= $tol_top, sprintf('%s %s: max |Δ log-prob| over the likely tokens (p > 1e-3) %.3g <= %g', $name, $be,
                                $dt, $tol_top));
    # The choices no rounding within the tolerance can flip: kvgate's margin above 2 x tol.
    # The first $need at least must be (all of them but where a family says otherwise for
    # the CUDA backend), and the comparison stops at the first that is not.
    my $gap = $kv->{gap} // -1;
    my $safe = 0;
    $safe++ while $safe < @{ $kv->{gaps} } && $kv->{gaps}[$safe] > 2 * $tol_top;
    ok($safe >= $need, sprintf("%s %s: kvgate's top-1/top-2 margin exceeds 2 x %g at the first %d choices (%d needed; "
                               . 'the smallest, %.4g, at choice %s): no greedy choice there can flip by rounding',
                               $name, $be, $tol_top, $safe, $need, $gap, $kv->{gap_at} // '?'))
        or diag("$name $be: the model's margins are too small for a greedy comparison at this tolerance: "
                . 'another prompt (seed) or a looser tolerance is needed; this is not a mismatch');
    my $n = scalar @{ $lcr->{ids} };
    is($n, $steps, "$name: llama.cpp chose $steps tokens");
    $n = $safe if $safe < $n;
    my $same = 0;
    $same++ while $same < $n && $same < @{ $kv->{ids} } && $kv->{ids}[$same] == $lcr->{ids}[$same];
    ok($same == $n && $n > 0, "$name $be: the first $n greedy tokens are llama.cpp's")
        or diag("$name $be: first difference at choice $same: kvgate " . ($kv->{ids}[$same] // 'none')
                . ', llama.cpp ' . ($lcr->{ids}[$same] // 'none'));
    my $dc = 0;
    for my $i (0 .. $same - 1) {
        my $x = abs($kv->{lp}[$i] - $lcr->{lp}[$i]);
        $dc = $x if $x > $dc;
    }
    # both printed with 6 decimals: 1e-6 of rounding on top of the tolerance
    ok($dc <= $tol_top + 1e-6, sprintf('%s %s: the chosen tokens\' log-probs within %g (max |Δ| %.3g)', $name, $be,
                                       $tol_top, $dc));
    return sprintf('%s: greedy %d/%d equal, max |Δ logprob| %.3g (tol %g), likely tokens %.3g, chosen tokens %.3g '
                   . '(tol %g), min gap %.4g', $be, $same, $steps, $d, $tol, $dt, $dc, $tol_top, $gap);
}

# The emulated CUDA backend against the CPU backend on the prompt logits: the largest
# difference as a share of the largest logit (t/unit/cuda_backend.c's measure, whose
# bound is 0.03 on its own models).
sub against_cpu {
    my ($name, $kc, $kv, $rel) = @_;
    my ($a, $b) = ($kc->{logits}, $kv->{logits});
    ok(@$a && @$a == @$b, "$name cuda-emu: prompt logits to set against the CPU's") or return 'cuda-emu: no logits';
    my ($m, $d) = (0, 0);
    for my $i (0 .. $#$b) {
        $m = abs($b->[$i]) if abs($b->[$i]) > $m;
        $d = abs($a->[$i] - $b->[$i]) if abs($a->[$i] - $b->[$i]) > $d;
    }
    my $r = $m > 0 ? $d / $m : 1;
    ok($r <= $rel, sprintf('%s cuda-emu: prompt logits within %g of the largest logit of the CPU backend\'s (%.4f)',
                           $name, $rel, $r));
    return sprintf('cuda-emu vs cpu: max |Δ logit| %.3g of max |logit| %.3g (%.4f, tol %g)', $d, $m, $r, $rel);
}

sub family_check {
    my ($name, $be, $bin, $model, @extra) = @_;
    # The emulated backend runs family_check without its strict checks (provenance and
    # races: kernels/emu/cuda_emu_strict.cc), which are more than half of its time there:
    # every family's kernels run under them in this file's greedy run above (the prompt and
    # its decode steps, same kernels), and in t/unit/cuda_backend.c's family-like models.
    local $ENV{KVG_EMU_STRICT} = 0 if $be eq 'cuda';
    my ($rc, $out, $err) = run($bin, '--model', $model, '--backend', $be, '--threads', $threads, @extra);
    my @points = $out =~ /^ok \d+ - \(([abc])\)/mg;
    ok($rc == 0 && "@points" eq 'a b c', "$name: family_check on $be: chunked prefill, batch 1 vs 8, "
                                          . 'prefix-cache hit: bit-identical')
        or diag("$bin exit $rc:\n$out$err");
    return "family_check $be " . ($rc == 0 ? 'ok' : 'FAILED');
}

for my $fam (@FAMILIES) {
    my $name = $fam->{family};
    my $arch = $fam->{arch} // $name;
    my $t0 = time;
    my ($rc, $model, $msg) = gguf($fam);
    is($rc, 0, "$name: tiny F32 GGUF written ($model)") or do { diag($msg); next };
    my $prompt = prompt_ids($fam->{seed} // 1);

    my $lcr = generate($ref, "$name-llamacpp", $model, $prompt, '--lib', $lc->{lib});
    is($lcr->{rc}, 0, "$name: llama.cpp loads and generates") or diag($lcr->{err});
    my $kv = generate($gen, "$name-cpu", $model, $prompt);
    is($kv->{rc}, 0, "$name: kvgate loads and generates on the CPU") or diag($kv->{err});
    like($kv->{err}, qr/^model: \S+ \(gguf, \Q$arch\E, /m, "$name: kvgate read the file as $arch");
    my @summary = ("$name: loads", compare($name, 'cpu', $kv, $lcr, $fam->{tol}, $fam->{tol_top} // $fam->{tol}, $steps));
    # Under ASan every family's code runs, with 4 decode steps after each prompt for the
    # families besides llama (the plain pass runs the 16).
    push @summary, family_check($name, 'cpu', $check, $model, $asan && $name ne 'llama' ? ('--decode', 4) : ());

    if (($fam->{cuda} || $fam->{cuda_rel}) && !$asan) {
        # Against llama.cpp: 64 greedy steps; against the CPU: the prompt's logits.
        my $kc = generate($emu_gen, "$name-cuda", $model, $prompt, $fam->{cuda} ? () : ('steps', 1), '--backend',
                          'cuda');
        is($kc->{rc}, 0, "$name: kvgate generates on the CUDA backend (emulated)") or diag($kc->{err});
        push @summary, compare($name, 'cuda-emu', $kc, $lcr, $fam->{cuda}, $fam->{cuda_top} // $fam->{cuda},
                                $fam->{cuda_greedy} // $steps) if $fam->{cuda};
        push @summary, against_cpu($name, $kc, $kv, $fam->{cuda_rel}) if $fam->{cuda_rel};
        # The emulator runs every thread of every kernel on the host, so family_check runs
        # there with 4 decode steps after each prompt instead of 16 (llama: the 16).
        push @summary, family_check($name, 'cuda', $emu_check, $model, $name eq 'llama' ? () : ('--decode', 4));
    } elsif ($fam->{cuda} || $fam->{cuda_rel}) {
        note("$name: the emulated CUDA backend runs in the plain pass (no ASan build of it here)");
    }
    diag(join('; ', @summary) . sprintf('; %.1f s', time - $t0));
}

done_testing();
