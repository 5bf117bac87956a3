#!/usr/bin/env perl
# t/gpu/torch_ref.py, the GPU bundle's PyTorch reference, as far as a machine without torch
# allows: its standard-library modes on a checkpoint exported by kvgate-generate
# (--check-export: header, sizes, the q/k row permutation from llama2.c's adjacent RoPE pairs
# to transformers' rotate_half; --stdlib-forward: transformers' conventions on the permuted
# weights in double precision, equal to kvgate's CPU logits; --compare-files: the tolerance
# rule), and run.sh's torch step emulated (KVG_RUN_EMU=1): export, kvgate's logits on the
# emulated CUDA backend, the mapping check, and the torch comparison itself, which runs when
# python3 has torch and transformers (on the CPU) and is otherwise recorded as skipped,
# "not available", with the reason. BUILD=<dir> picks the build (build/bin and build/emu/bin).
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use FindBin;
use JSON::PP;

my $root = "$FindBin::Bin/..";
my $build = $ENV{BUILD} || 'build';
$build = "$root/$build" unless $build =~ m{^/};
my $gen = "$build/bin/kvgate-generate";
my $emu_gen = "$build/emu/bin/kvgate-generate";
my $shared = $ENV{KVGATE_SHARED} || "$root/../shared";
my $stories = "$shared/models/stories260K";
my $ref = "$root/t/gpu/torch_ref.py";
ok(-x $gen, "$gen is built") or BAIL_OUT("build it first: make BUILD=$build engine");
ok(-x $emu_gen, "$emu_gen is built") or BAIL_OUT("build it first: make BUILD=$build emu");
my $dir = tempdir(CLEANUP => 1);

sub slurp { my ($f) = @_; open my $fh, '<', $f or return ''; local $/; my $s = <$fh>; $s // '' }
sub slurp_raw { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

sub run {
    my (@cmd) = @_;
    my $pid = open(my $fh, '-|') // die "fork: $!";
    if (!$pid) {
        open STDERR, '>&', \*STDOUT or die;
        open STDIN, '<', '/dev/null' or die;
        exec @cmd or exit 127;
    }
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return ($? >> 8, $out);
}

my ($rc, $out) = run($gen, '--model', "$stories/stories260K.bin", '--tokenizer', "$stories/tok512.bin",
                     '--export-llama2c', "$dir/s.bin");
is($rc, 0, 'stories260K exported') or diag($out);

# --check-export
($rc, $out) = run('python3', $ref, '--check-export', "$dir/s.bin", '--json', "$dir/c.json");
is($rc, 0, '--check-export passes on the export') or diag($out);
like($out, qr/dim 64, hidden 172, 5 layers, 8\/4 heads of 8, vocab 512 \(shared classifier\), seq 512, 1056540 bytes: size ok/,
     'and reads its header');
my $c = eval { decode_json(slurp("$dir/c.json")) } // {};
ok($c->{ok} && $c->{size} == $c->{expected_size}, 'JSON: ok, the size the header implies');
my $p = $c->{rope_permutation} // {};
is(join(' ', @{ $p->{src_rows} // [] }), '0 2 4 6 1 3 5 7',
   'HF row j of a head of 8 takes llama2.c row 2j (first half) or 2(j-4)+1 (second half)');
ok($p->{bijection} && $p->{max_rotated_diff} < 1e-9 && $p->{max_score_diff} < 1e-9,
   'rotate_half on the permuted rows is the permuted adjacent rotation; q.k unchanged') or diag(explain($p));
cmp_ok($p->{unpermuted_diff}, '>', 1e-3, 'and without the permutation the two rotations differ');

# a truncated file and a header of zeros fail, saying why
{
    my $all = slurp("$dir/s.bin");
    open my $fh, '>:raw', "$dir/short.bin" or die;
    print $fh substr($all, 0, length($all) - 4);
    close $fh;
    ($rc, $out) = run('python3', $ref, '--check-export', "$dir/short.bin");
    is($rc, 1, '--check-export fails on a truncated file');
    like($out, qr/size WRONG.*FAIL: the file has 1056536 bytes, the header says 1056540/s, 'naming the sizes') or diag($out);
    open $fh, '>:raw', "$dir/zero.bin" or die;
    print $fh "\0" x 64;
    close $fh;
    ($rc, $out) = run('python3', $ref, '--check-export', "$dir/zero.bin");
    ok($rc == 2 && $out =~ /header dim = 0/, '--check-export: a zero header is an error') or diag($out);
}

# --stdlib-forward: transformers' conventions on the permuted weights = kvgate's CPU logits
my $ids = '1 300 301 302 303 45 67 89 10 200 311 401 7 99 123 17';
($rc, $out) = run($gen, '--model', "$dir/s.bin", '--tokenizer', "$stories/tok512.bin", '--prompt-ids', $ids, '--ids',
                  '--max-tokens', '0', '--prompt-logits', "$dir/cpu.txt");
is($rc, 0, 'kvgate CPU logits of the export') or diag($out);
($rc, $out) = run('python3', $ref, '--stdlib-forward', "$dir/s.bin", '--ids', $ids, '--logits-out', "$dir/py.txt",
                  '--compare', "kvgate-cpu=$dir/cpu.txt", '--tol', '1e-5', '--json', "$dir/f.json");
is($rc, 0, '--stdlib-forward equals kvgate CPU within 1e-5 of the largest logit') or diag($out);
my $f = eval { decode_json(slurp("$dir/f.json")) } // {};
my $fc = $f->{compare}{'kvgate-cpu'} // {};
ok($fc->{argmax_equal} && $fc->{n} == 512 && $fc->{rel} < 1e-5, sprintf('same argmax, rel %.3g', $fc->{rel} // -1));

# an own classifier (negative vocab_size; the 8B shape's layout): stories260K with its
# embedding copied after the freq_cis tables as the classifier gives the same logits
{
    my $all = slurp_raw("$dir/s.bin");
    my ($dim, $vocab) = unpack('l< x16 l<', $all);
    substr($all, 20, 4) = pack('l<', -$vocab);
    open my $fh, '>:raw', "$dir/u.bin" or die;
    print $fh $all, substr($all, 28, 4 * $vocab * $dim);
    close $fh;
    ($rc, $out) = run('python3', $ref, '--check-export', "$dir/u.bin");
    ok($rc == 0 && $out =~ /vocab 512 \(own classifier\).* size ok/, '--check-export: an own classifier after the freq_cis tables')
        or diag($out);
    ($rc, $out) = run($gen, '--model', "$dir/u.bin", '--tokenizer', "$stories/tok512.bin", '--prompt-ids', $ids, '--ids',
                      '--max-tokens', '0', '--prompt-logits', "$dir/ucpu.txt");
    is($rc, 0, 'kvgate reads it') or diag($out);
    ($rc, $out) = run('python3', $ref, '--stdlib-forward', "$dir/u.bin", '--ids', $ids,
                      '--compare', "kvgate-cpu=$dir/ucpu.txt", '--compare', "tied=$dir/cpu.txt", '--tol', '1e-5');
    is($rc, 0, '--stdlib-forward with the own classifier equals kvgate, and the tied logits') or diag($out);
}

# --compare-files: kvgate-gpu-check's rule
($rc, $out) = run('python3', $ref, '--compare-files', "$dir/py.txt", "$dir/cpu.txt", '--tol', '0.03');
is($rc, 0, '--compare-files: the same logits pass') or diag($out);
{
    my @l = split /\n/, slurp("$dir/cpu.txt");
    $l[5] += 0.05 * 20;             # stories260K's logits reach ~14: 1.0 is over 3% of them
    open my $fh, '>', "$dir/off.txt" or die;
    print $fh map { "$_\n" } @l;
    close $fh;
    ($rc, $out) = run('python3', $ref, '--compare-files', "$dir/off.txt", "$dir/cpu.txt", '--tol', '0.03');
    ok($rc == 1 && $out =~ /max\|diff\| .* > tol 0\.03/, '--compare-files: a logit 1.0 off fails') or diag($out);
}

# --probe: torch, transformers and the device, or the reason
my ($prc, $pout) = run('python3', $ref, '--probe', '--device', 'cpu');
my $have_torch = $prc == 0;
ok($prc == 0 || ($prc == 3 && $pout =~ /no torch|no transformers/), '--probe: available, or why not') or diag($pout);
note("torch here: $pout");

# run.sh's torch step, emulated
{
    local $ENV{KVG_RUN_EMU} = 1;
    local $ENV{KVG_STEPS} = 'torch';
    local $ENV{KVG_BIN} = "$build/emu/bin";
    local $ENV{KVG_MODELS} = "$shared/models";
    local $ENV{OUT} = "$dir/out";
    local $ENV{TMPDIR} = "$dir/tmp";
    mkdir "$dir/tmp" or die;
    ($rc, $out) = run("$root/t/gpu/run.sh");
    is($rc, 0, 'run.sh KVG_STEPS=torch, emulated, passes') or diag($out);
    my $res = eval { decode_json(slurp("$dir/out/results.json")) } // {};
    my %st = map { $_->{name} => $_ } @{ $res->{steps} // [] };
    is(join(' ', map { "$_->{name}:$_->{status}" } @{ $res->{steps} // [] }),
       'torch-export-stories260K:pass torch-kvgate-stories260K:pass torch-mapping-stories260K:pass torch-stories260K:'
       . ($have_torch ? 'pass' : 'skipped'), 'the steps and their status') or diag($out);
    ok(($st{'torch-export-stories260K'}{result} // {})->{ok}, 'the export checked');
    my $m = ($st{'torch-mapping-stories260K'}{result} // {})->{compare} // {};
    ok(defined $m->{'kvgate-cuda'} && $m->{'kvgate-cuda'}{ok} && $m->{'kvgate-cuda'}{rel} < 0.03,
       sprintf('the mapping vs kvgate on the emulated device: rel %.3g', ($m->{'kvgate-cuda'} // {})->{rel} // -1));
    my $t = $st{'torch-stories260K'}{result} // {};
    if ($have_torch) {
        ok($t->{available} && $t->{ok}, 'torch within the tolerance of kvgate') or diag(explain($t));
    } else {
        ok(defined $t->{available} && !$t->{available} && $t->{reason} =~ /no torch|no transformers/,
           "the torch step: not available, with the reason ($t->{reason})") or diag(explain($t));
        like($out, qr/^torch-stories260K\s+skipped\s+\(not available: python3 has no (?:torch|transformers)/m,
             'and the summary says so');
    }
    opendir my $dh, "$dir/tmp" or die;
    my @left = grep { !/^\.\.?$/ } readdir $dh;
    ok(!@left && !glob("$dir/out/steps/*.bin"), 'the scratch folder is removed, no checkpoint left') or diag("@left");
}

done_testing;
