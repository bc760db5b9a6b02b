// A real OpenID provider (oidc-provider) for tether's OAuth tests.
// Usage: node idp.mjs <config.json>; prints "ready <issuer>" once it listens.
// The config names the port, the signing keys (private JWKS), the resources
// it issues JWT access tokens for, its clients and its users.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const users = config.users;
const SCOPES = 'tether:run tether:approve tether:metrics tether:operate';

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: config.jwks,
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups', ...SCOPES.split(' ')],
  claims: { openid: ['sub'], profile: ['name'], email: ['email'], groups: ['groups'] },
  findAccount: async (ctx, id) => (users[id] ? {
    accountId: id,
    claims: async () => ({ sub: id, ...users[id] }),
  } : undefined),
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    registration: { enabled: true },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      useGrantedResource: () => true,
      defaultResource: (ctx, client, oneOf) => oneOf,
      getResourceServerInfo: (ctx, resource) => {
        if (!config.resources.includes(resource)) throw new Error(`unknown resource ${resource}`);
        // Resources named .../opaque get opaque tokens, checked by introspection (RFC 7662).
        const format = resource.endsWith('/opaque') ? 'opaque' : 'jwt';
        return { scope: SCOPES, audience: resource, accessTokenFormat: format, accessTokenTTL: 600,
                 jwt: { sign: { alg: 'RS256' } } };
      },
    },
  },
  // Identity providers in deployments put who the user is into access tokens; so does this one.
  extraTokenClaims: (ctx, token) => {
    const user = token.accountId && users[token.accountId];
    return user ? { name: user.name, email: user.email, groups: user.groups } : undefined;
  },
  ttl: { Session: 60, Interaction: 600, Grant: 600, AccessToken: 600, AuthorizationCode: 60, IdToken: 600,
         ClientCredentials: 600 },
  cookies: { keys: ['tether-test-idp'] },
});
provider.proxy = false;
provider.listen(config.port, '127.0.0.1', () => {
  console.log(`ready ${config.issuer}`);
});
