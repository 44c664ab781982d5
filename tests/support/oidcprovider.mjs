// A real OpenID Connect provider for the tests: the npm package `oidc-provider` on
// Debian's nodejs, started by tests/support/oidcprovider.py, which passes:
//   argv[2]  the path of oidc-provider's lib/index.js (installed outside the clone)
//   argv[3]  the port to listen on (127.0.0.1)
//   env OIDC_CLIENT_SECRET  the secret of its one client, `llmgw`
//
// Two people sign in with a password each (alice, bob), with groups the tests change
// through /test/groups. The tests also reach:
//   POST /test/groups {"login", "groups"}  a person's groups from now on
//   POST /test/skew {"seconds"}            the provider's clock that far off (ID tokens
//                                          it signs then say so: an expired one)
//   GET  /liar/.well-known/openid-configuration
//       this provider's discovery document under another issuer: a control plane set
//       to trust `<base>/liar` receives ID tokens from `<base>`, another issuer.
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const [, , modulePath, portText] = process.argv;
const { default: Provider } = await import(pathToFileURL(modulePath).href);
const port = Number(portText);
const base = `http://127.0.0.1:${port}`;

const realNow = Date.now.bind(Date);
let skewMs = 0;
Date.now = () => realNow() + skewMs;

const people = {
  alice: { password: 'alice-pw', name: 'Alice Adams', email: 'alice@example.test', groups: ['eng', 'ops'] },
  bob: { password: 'bob-pw', name: 'Bob Brown', email: 'bob@example.test', groups: ['eng'] },
};

const provider = new Provider(base, {
  clients: [{
    client_id: 'llmgw',
    client_secret: process.env.OIDC_CLIENT_SECRET,
    redirect_uris: [`${base}/never-used`],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  cookies: { keys: ['llmgw-tests-cookie-key'] },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email'],
    groups: ['groups'],
  },
  // The scopes' claims in the ID token itself, as Entra ID and most providers do.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  pkce: { required: () => true },
  async findAccount(ctx, sub) {
    const who = people[sub];
    if (!who) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub, name: who.name, preferred_username: sub, email: who.email, groups: [...who.groups],
        };
      },
    };
  },
});
// Any control plane of the tests (its port is picked at run time) may be sent back to.
provider.Client.prototype.redirectUriAllowed = function allowed(uri) {
  return /^http:\/\/127\.0\.0\.1:\d+\/admin\/login\/oidc\/callback$/.test(uri);
};
provider.on('server_error', (ctx, err) => console.error('server_error', err));

function readBody(req) {
  return new Promise((resolve, reject) => {
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', () => resolve(Buffer.concat(parts).toString()));
    req.on('error', reject);
  });
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

async function interaction(req, res, uid) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    send(res, 200, 'text/html', `<!doctype html><title>Test IdP</title><h1>Test IdP sign-in</h1>
<form method="post" action="/interaction/${escape(uid)}">
<input id="login" name="login"><input id="password" name="password" type="password">
<button type="submit">Sign in at the IdP</button></form>`);
    return;
  }
  const form = new URLSearchParams(await readBody(req));
  const login = form.get('login') || '';
  const who = people[login];
  if (!who || who.password !== form.get('password')) {
    send(res, 401, 'text/html', '<!doctype html><p id="error">wrong login or password</p>');
    return;
  }
  const grant = new provider.Grant({ accountId: login, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  const grantId = await grant.save();
  await provider.interactionFinished(
    req, res, { login: { accountId: login }, consent: { grantId } }, { mergeWithLastSubmission: false },
  );
}

const callback = provider.callback();
const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, base);
    const inter = url.pathname.match(/^\/interaction\/([^/]+)$/);
    if (inter) {
      await interaction(req, res, inter[1]);
    } else if (req.method === 'POST' && url.pathname === '/test/groups') {
      const { login, groups } = JSON.parse(await readBody(req));
      people[login].groups = groups;
      send(res, 200, 'application/json', JSON.stringify(people[login].groups));
    } else if (req.method === 'POST' && url.pathname === '/test/skew') {
      skewMs = Number(JSON.parse(await readBody(req)).seconds) * 1000;
      send(res, 200, 'application/json', JSON.stringify({ skew: skewMs / 1000 }));
    } else if (url.pathname === '/liar/.well-known/openid-configuration') {
      const doc = await (await fetch(`${base}/.well-known/openid-configuration`)).json();
      send(res, 200, 'application/json', JSON.stringify({ ...doc, issuer: `${base}/liar` }));
    } else {
      callback(req, res);
    }
  } catch (err) {
    console.error(err);
    send(res, 500, 'text/plain', String(err));
  }
});
server.listen(port, '127.0.0.1', () => console.log(`oidc-provider listening on ${base}`));
