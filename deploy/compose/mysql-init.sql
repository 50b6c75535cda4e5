-- The capture user of the compose stack: replication and read access only.
CREATE USER IF NOT EXISTS 'sluice'@'%' IDENTIFIED BY 'sluice';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'sluice'@'%';

-- Something to copy at start (capture-mysql runs with [snapshot] mode = "snapshot+stream" in the
-- stack) and to change afterwards.
CREATE DATABASE IF NOT EXISTS shop;
CREATE TABLE shop.orders (
  id BIGINT UNSIGNED PRIMARY KEY AUTO_INCREMENT,
  customer VARCHAR(64) NOT NULL,
  amount DECIMAL(12, 2) NOT NULL,
  status ENUM('new', 'paid', 'shipped') NOT NULL DEFAULT 'new',
  placed DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
);
INSERT INTO shop.orders (customer, amount, status) VALUES
  ('ada', 12.50, 'paid'), ('grace', 99.99, 'new'), ('linus', 5.00, 'shipped');
