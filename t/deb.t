#!/usr/bin/perl
# The Debian packages (make deb, debian/): they build, install on this machine with
# dpkg -i, enable the module the way Debian's libnginx-mod-* packages do (the
# modules-enabled link, `nginx -t` with the system configuration), create the engine's
# system user; the engine starts the way systemd starts kvgate-engine@NAME.service
# (the installed unit's User=, Group=, SupplementaryGroups=, EnvironmentFile=,
# RuntimeDirectory= and ExecStart=, applied here: CI containers run no systemd), and a
# request goes through an nginx that loads the installed module (the shipped
# modules-enabled snippet and example site, on a free port) to that engine. Then the
# packages are purged and the machine is as it was: the modules-enabled directory,
# nginx -t, nginx running or not, no kvgate user unless there was one.
#
# Runs as root on Debian (as CI does); skips elsewhere, under KVGATE_ASAN=1 (the
# packages carry no sanitizer build; the plain pass covers them) and with
# KVGATE_DEB_TEST=0. KVGATE_DEB_TEST=1 turns the skips for missing tools into failures.
# Reuses $BUILD/deb when its packages are up to date with the sources (scripts/deb.sh).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(remove_tree);
use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);

my $root = abs_path(dirname(abs_path(__FILE__)) . '/..');
my $build = $ENV{BUILD} || 'build';
$build = "$root/$build" unless $build =~ m{^/};
my $force = ($ENV{KVGATE_DEB_TEST} // '') eq '1';
my $parent = $$;

sub skip_or_fail {
    my ($why) = @_;
    if ($force) {
        fail("KVGATE_DEB_TEST=1 but $why");
        done_testing;
        exit 1;
    }
    plan skip_all => $why;
}

plan skip_all => 'KVGATE_DEB_TEST=0' if ($ENV{KVGATE_DEB_TEST} // '') eq '0';
plan skip_all => 'the packages have no ASan build (covered by the plain pass)' if ($ENV{KVGATE_ASAN} // '') eq '1';
skip_or_fail('not Debian (no /etc/debian_version)') unless -f '/etc/debian_version';
skip_or_fail('needs root: it installs the packages on this machine with dpkg (CI runs as root)') if $> != 0;
sub have { my ($c) = @_; return system("command -v $c >/dev/null 2>&1") == 0 }
skip_or_fail('dpkg-buildpackage not found (make deps, as root, installs dpkg-dev and debhelper)')
    unless have('dpkg-buildpackage');
skip_or_fail('/usr/sbin/nginx not found (make deps installs nginx)') unless -x '/usr/sbin/nginx';
{
    my $unmet = `cd '$root' && dpkg-checkbuilddeps 2>&1`;
    skip_or_fail("the build dependencies are missing: $unmet") if $?;
}
for my $p (qw(libnginx-mod-http-kvgate kvgate-engine)) {
    my $st = `dpkg-query -W -f='\${Status}' $p 2>/dev/null`;
    plan skip_all => "$p is already installed here ($st): the test does not touch an installation it did not make"
        if $st =~ /\S/ && $st !~ /not-installed/;
}

my $t0 = time;

# ---- The machine as found ---------------------------------------------------------
my $menabled = '/etc/nginx/modules-enabled';
sub modules_enabled {
    opendir(my $d, $menabled) or return '(none)';
    my @e = sort grep { !/^\.\.?$/ } readdir $d;
    return join "\n", map { my $l = readlink "$menabled/$_"; defined $l ? "$_ -> $l" : $_ } @e;
}
sub nginx_t { my $out = `/usr/sbin/nginx -t 2>&1`; return ($? == 0, $out) }
sub nginx_running {
    open(my $f, '<', '/run/nginx.pid') or return 0;
    my $pid = <$f> // '';
    return $pid =~ /^(\d+)/ && kill(0, $1) ? 1 : 0;
}
my %before = (
    enabled => modules_enabled(),
    nginx_t => (nginx_t())[0],
    running => nginx_running(),
    user    => scalar(getpwnam('kvgate')) ? 1 : 0,
    group   => scalar(getgrnam('kvgate')) ? 1 : 0,
    etc     => -e '/etc/kvgate' ? 1 : 0,
    run     => -e '/run/kvgate' ? 1 : 0,
);

# ---- Build ------------------------------------------------------------------------
my $out = `cd '$root' && BUILD='$build' KVG_DEB_LINTIAN=0 scripts/deb.sh 2>&1`;
is($?, 0, 'make deb builds the packages') or diag($out);
note($out);
chomp(my $version = `cd '$root' && dpkg-parsechangelog -S Version`);
chomp(my $arch = `dpkg-architecture -qDEB_HOST_ARCH`);
my $mod_deb = "$build/deb/libnginx-mod-http-kvgate_${version}_$arch.deb";
my $eng_deb = "$build/deb/kvgate-engine_${version}_$arch.deb";
ok(-f $mod_deb && -f $eng_deb, 'both .deb files are in build/deb') or BAIL_OUT('no packages to install');

# What Debian's own nginx modules declare: the ABI of the nginx they were built against.
my $mod_depends = `dpkg-deb -f '$mod_deb' Depends`;
my $provides = `dpkg-query -W -f='\${Provides}' nginx`;
my ($abi) = $provides =~ /(nginx-abi-[\w.~+-]+)/;
ok($abi && $mod_depends =~ /(^|[ ,])\Q$abi\E(,|$)/m, "the module depends on $abi, the installed nginx's ABI")
    or diag("Depends: $mod_depends; nginx Provides: $provides");
like(`dpkg-deb -c '$mod_deb'`, qr{\./usr/share/nginx/modules-available/mod-http-kvgate\.conf$}m,
     'the load snippet is in modules-available');

if (have('lintian')) {
    my $l = `lintian '$mod_deb' '$eng_deb' 2>&1`;
    my @err = grep { /^E: / } split /\n/, $l;
    is(scalar(@err), 0, 'lintian reports no errors') or diag($l);
}

# ---- Install ----------------------------------------------------------------------
my ($installed, $instance, $conf, $made_run, $engine_pid, $nginx_pid, $prefix);

# dpkg takes its lock without waiting: retry while another apt/dpkg holds it.
sub dpkg {
    my (@args) = @_;
    my $deadline = time + 120;
    while (1) {
        my $o = `dpkg @args 2>&1`;
        my $rc = $?;
        return ($rc, $o) if $rc == 0 || $o !~ /lock/i || time > $deadline;
        sleep 1;
    }
}

sub cleanup {
    return unless $$ == $parent;
    local $?;
    if ($nginx_pid) {
        kill 'QUIT', $nginx_pid;
        my $end = time + 10;
        sleep 0.05 while kill(0, $nginx_pid) && time < $end;
        kill 'KILL', $nginx_pid if kill 0, $nginx_pid;
        undef $nginx_pid;
    }
    if ($engine_pid) {
        kill 'KILL', $engine_pid;
        waitpid $engine_pid, 0;
        undef $engine_pid;
    }
    unlink $conf if $conf;
    unlink "/run/kvgate/$instance.sock" if $instance;
    rmdir '/run/kvgate' if $made_run;
    if ($installed) {
        dpkg('--purge', 'kvgate-engine', 'libnginx-mod-http-kvgate');
        undef $installed;
    }
    # A system user is left behind by a purge, on purpose (Debian's policy: files may
    # still belong to it); one this test made goes.
    system('userdel kvgate >/dev/null 2>&1') if !$before{user} && getpwnam('kvgate');
    system('groupdel kvgate >/dev/null 2>&1') if !$before{group} && getgrnam('kvgate');
    remove_tree($prefix) if $prefix && Test::More->builder->is_passing && !$ENV{KVGATE_TEST_KEEP};
}
END { cleanup() }
$SIG{INT} = $SIG{TERM} = sub { cleanup(); exit 1 };

$installed = 1;
my ($rc, $dpkg_out) = dpkg('-i', $mod_deb, $eng_deb);
is($rc, 0, 'dpkg -i installs both packages') or do { diag($dpkg_out); BAIL_OUT('not installed') };

my $link = "$menabled/50-mod-http-kvgate.conf";
is(readlink($link), '/usr/share/nginx/modules-available/mod-http-kvgate.conf',
   'postinst links the snippet into modules-enabled, as dh_nginx does for every module');
like(do { local (@ARGV, $/) = ($link); <> // '' }, qr{^load_module modules/ngx_http_kvgate_module\.so;$}m,
     'the snippet loads the installed module');
ok(-f '/usr/lib/nginx/modules/ngx_http_kvgate_module.so', 'the module is under /usr/lib/nginx/modules');
my ($t_ok, $t_out) = nginx_t();
ok($t_ok, 'nginx -t passes with the system configuration, which now loads the module') or diag($t_out);

my @pw = getpwnam('kvgate');
ok(@pw && $pw[2] < 1000, 'postinst created the system user kvgate') or diag("kvgate: @pw");

# ---- The unit, applied the way systemd would --------------------------------------
my $unit_file = '/lib/systemd/system/kvgate-engine@.service';
$unit_file = '/usr/lib/systemd/system/kvgate-engine@.service' unless -f $unit_file;
ok(-f $unit_file, "the template unit is installed ($unit_file)") or BAIL_OUT('no unit');
my %unit;
{
    open(my $f, '<', $unit_file) or die "$unit_file: $!";
    my $section = '';
    while (<$f>) {
        next if /^\s*[#;]/ || !/\S/;
        if (/^\[(\w+)\]/) { $section = $1; next }
        push @{ $unit{$section}{$1} }, $2 if /^\s*(\w+)=(.*?)\s*$/;
    }
}
my %svc = map { $_ => $unit{Service}{$_}[-1] } keys %{ $unit{Service} };
is($svc{Restart}, 'on-failure', 'Restart=on-failure');
is($svc{User}, 'kvgate', 'the engine runs as its own user');

$instance = "debtest$$";
(my $env_file = $svc{EnvironmentFile} // '') =~ s/%i/$instance/g;
is($env_file, "/etc/kvgate/$instance.conf", 'settings come from /etc/kvgate/NAME.conf');
$conf = $env_file;
ok(-d '/etc/kvgate', 'the package ships /etc/kvgate');
# A synthetic model: no file the kvgate user would need to read from this checkout.
open(my $cf, '>', $conf) or die "$conf: $!";
print $cf "# written by t/deb.t\nMODEL=synthetic:260K\nTOKENIZER=\nCHAT_TEMPLATE=plain\nTHREADS=1\nKV_MEMORY=32M\n"
        . "EXTRA_ARGS=--max-running 8 --drain-timeout 2\n";
close $cf;

if (have('systemd-analyze')) {
    my $d = tempdir(CLEANUP => 1);
    system('cp', $unit_file, "$d/kvgate-engine\@$instance.service") == 0 or die 'cp';
    my $v = `timeout 30 systemd-analyze verify '$d/kvgate-engine\@$instance.service' 2>&1`;
    is($?, 0, 'systemd-analyze verify accepts the unit') or diag($v);
}

# EnvironmentFile= syntax: KEY=VALUE lines, optional quotes, # comments.
my %env = (PATH => '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG => 'C.UTF-8');
{
    open(my $f, '<', $conf) or die;
    while (<$f>) {
        next if /^\s*[#;]/ || !/=/;
        chomp;
        my ($k, $v) = /^\s*(\w+)=(.*)$/ or next;
        $v =~ s/^"(.*)"$/$1/ or $v =~ s/^'(.*)'$/$1/;
        $env{$k} = $v;
    }
}
my ($uid, $gid) = (getpwnam($svc{User}))[2, 3];
$gid = getgrnam($svc{Group}) if $svc{Group};
my @groups = ($gid, map { scalar getgrnam($_) } split ' ', $svc{SupplementaryGroups} // '');
ok(!grep({ !defined } @groups), "the unit's groups exist ($svc{Group} $svc{SupplementaryGroups})");
if (my $rd = $svc{RuntimeDirectory}) {
    $made_run = !-e "/run/$rd";
    mkdir "/run/$rd";
    chmod oct($svc{RuntimeDirectoryMode} // '0755'), "/run/$rd";
    chown $uid, $gid, "/run/$rd";
}
(my $exec = $svc{ExecStart}) =~ s/%i/$instance/g;
my @cmd = split ' ', $exec;
ok(-x $cmd[0], "ExecStart runs $cmd[0]");

my $elog = tempdir(CLEANUP => 1) . '/engine.log';
$engine_pid = fork // die "fork: $!";
if ($engine_pid == 0) {
    open STDIN, '<', '/dev/null';
    open STDOUT, '>>', $elog;
    open STDERR, '>>', $elog;
    %ENV = %env;
    # Groups first (setgroups needs root), then the user, as systemd does.
    $) = join ' ', $gid, @groups;
    $( = $gid;
    $< = $> = $uid;
    POSIX::_exit(126) if $> != $uid || $< != $uid;
    exec @cmd or POSIX::_exit(127);
}

sub wait_for {
    my ($cond, $secs) = @_;
    my $end = time + $secs;
    while (time < $end) {
        return 1 if $cond->();
        sleep 0.1;
    }
    return $cond->();
}
sub engine_log { open(my $f, '<', $elog) or return ''; local $/; return <$f> }

my $sock = "/run/kvgate/$instance.sock";
ok(wait_for(sub { -S $sock || waitpid($engine_pid, WNOHANG) != 0 }, 30) && -S $sock,
   "the engine listens on the default socket, $sock") or diag(engine_log());
my @st = stat $sock;
is(($st[2] // 0) & 07777, 0660, 'the socket is 0660');
is($st[4], $uid, 'the socket belongs to kvgate');
is(scalar(getgrgid($st[5] // -1)), 'www-data', "the socket's group is www-data (nginx's workers)");

# ---- nginx with the installed module and the example site -------------------------
$prefix = tempdir('kvgate-deb-XXXXXX', TMPDIR => 1);
chmod 0755, $prefix;
mkdir "$prefix/$_" for qw(logs tmp);
chmod 0755, "$prefix/tmp";

my $port = do {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1, ReuseAddr => 1)
        or die "no free port: $!";
    my $p = $s->sockport;
    close $s;
    $p;
};
my $example = '/usr/share/doc/kvgate-engine/examples/kvgate-site.conf';
my $site = -f $example ? `cat '$example'` : -f "$example.gz" ? `zcat '$example.gz'` : '';
ok($site =~ /kvgate_pass/, 'the example site is shipped') or diag("$example: missing");
$site =~ s{unix:/run/kvgate/\S+?\.sock}{unix:$sock}g;
$site =~ s{listen\s+127\.0\.0\.1:\d+}{listen 127.0.0.1:$port}g;
$site =~ s{/var/log/nginx/}{$prefix/logs/}g;
open(my $sf, '>', "$prefix/site.conf") or die;
print $sf $site;
close $sf;
open(my $nf, '>', "$prefix/nginx.conf") or die;
print $nf <<"EOF";
# As Debian's /etc/nginx/nginx.conf: workers as www-data, the enabled modules, the site.
user www-data;
worker_processes 2;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log notice;
include /etc/nginx/modules-enabled/*.conf;
events { worker_connections 128; }
http {
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;
    include $prefix/site.conf;
}
EOF
close $nf;
# nginx's own prefix (/usr/share/nginx, where modules/ leads to /usr/lib/nginx/modules):
# the snippet's load_module path is relative to it.
my @ngx = ('/usr/sbin/nginx', '-c', "$prefix/nginx.conf", '-e', "$prefix/logs/error.log");
my $nt = `@ngx -t 2>&1`;
is($?, 0, 'nginx -t: the installed module with the example site') or diag($nt);
system(@ngx) == 0 or diag('nginx did not start: ' . `cat $prefix/logs/error.log`);
wait_for(sub { -s "$prefix/nginx.pid" }, 10);
($nginx_pid) = `cat $prefix/nginx.pid 2>/dev/null` =~ /(\d+)/;
ok($nginx_pid, 'nginx started');

my $http = HTTP::Tiny->new(timeout => 10);
my $base = "http://127.0.0.1:$port";
my $models;
ok(wait_for(sub {
       my $r = $http->get("$base/v1/models");
       $models = $r->{status} == 200 ? eval { decode_json($r->{content}) } : undef;
       $models && @{ $models->{data} // [] };
   }, 30), 'GET /v1/models through the installed nginx') or diag(`cat $prefix/logs/error.log`);
my $model = $models ? $models->{data}[0]{id} : 'none';
my $r;
wait_for(sub {
    $r = $http->post("$base/v1/completions", { headers => { 'Content-Type' => 'application/json' },
        content => encode_json({ model => $model, prompt => 'Once upon a time', max_tokens => 4 }) });
    $r->{status} != 503;    # the workers may still be connecting
}, 20);
is($r->{status}, 200, 'a completion through the installed nginx from the installed engine')
    or diag("$r->{status} $r->{content}\n" . engine_log());
my $c = $r->{status} == 200 ? eval { decode_json($r->{content}) } : {};
ok(length($c->{choices}[0]{text} // '') > 0 && ($c->{usage}{completion_tokens} // 0) >= 1, 'it generated text')
    or diag($r->{content});
like($http->get("$base/metrics")->{content} // '', qr/^kvgate_/m, '/metrics answers');
my $st = $http->get("$base/status", { headers => { Accept => 'application/json' } });
ok($st->{status} == 200 && eval { decode_json($st->{content}) }, '/status answers JSON');

# ---- Stop, purge, and the machine as it was ---------------------------------------
kill 'QUIT', $nginx_pid if $nginx_pid;
ok($nginx_pid && wait_for(sub { !kill 0, $nginx_pid }, 10), 'nginx quits');
undef $nginx_pid;
my @bad = grep { /\[alert\]|\[emerg\]|exited on signal/ } split /\n/, `cat $prefix/logs/error.log`;
is(scalar(@bad), 0, "nginx's error.log is clean") or diag(join "\n", @bad);
kill 'TERM', $engine_pid;
ok(wait_for(sub { waitpid($engine_pid, WNOHANG) == $engine_pid }, 15), 'the engine stops on SIGTERM (systemctl stop)');
is($? >> 8, 0, 'with status 0') or diag(engine_log());
undef $engine_pid;

unlink $conf;
undef $conf;
($rc, $dpkg_out) = dpkg('--purge', 'kvgate-engine', 'libnginx-mod-http-kvgate');
is($rc, 0, 'dpkg --purge removes both packages') or diag($dpkg_out);
undef $installed;
cleanup();

is(modules_enabled(), $before{enabled}, 'modules-enabled is as it was (no link, no .removed link left)');
ok(!-e '/usr/lib/nginx/modules/ngx_http_kvgate_module.so', 'the module is gone');
($t_ok, $t_out) = nginx_t();
is($t_ok, $before{nginx_t}, 'nginx -t with the system configuration: as before') or diag($t_out);
is(nginx_running(), $before{running}, 'the system nginx is running, or not, as before');
is(scalar(getpwnam('kvgate')) ? 1 : 0, $before{user}, 'the kvgate user: as before');
is(-e '/etc/kvgate' ? 1 : 0, $before{etc}, '/etc/kvgate: as before');
is(-e '/run/kvgate' ? 1 : 0, $before{run}, '/run/kvgate: as before');
note(sprintf 'deb.t took %.0f s', time - $t0);

done_testing;
