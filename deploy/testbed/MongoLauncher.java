// Starts mongo-java-server (in-memory backend, oplog and change streams enabled) on the given
// loopback ports, one independent server per port, and reports MongoDB 4.4 (wire version 9):
// the Rust driver refuses servers older than that, and mongo-java-server's own default is lower.
//
// Usage: java -cp <jars>:<dir> MongoLauncher PORT [PORT...]
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import java.util.ArrayList;
import java.util.List;

public final class MongoLauncher {
    /** The version the servers report. */
    static final class Reported implements MongoVersion {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(4, 4, 0);
        }

        @Override
        public String toVersionString() {
            return "4.4.0";
        }

        @Override
        public int getWireVersion() {
            return 9;
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: MongoLauncher PORT [PORT...]");
            System.exit(2);
        }
        List<MongoServer> servers = new ArrayList<>();
        for (String arg : args) {
            int port = Integer.parseInt(arg);
            MemoryBackend backend = new MemoryBackend();
            backend.version(new Reported());
            MongoServer server = new MongoServer(backend);
            server.enableOplog();
            server.bind("127.0.0.1", port);
            servers.add(server);
            System.out.println("mongo-java-server listening on 127.0.0.1:" + port);
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> servers.forEach(MongoServer::shutdown)));
        Thread.currentThread().join();
    }
}
